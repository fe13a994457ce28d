"""Whether the dumps picture a job that was still running, and what is left then of a hang.

Takes the linked findings; returns them, where ranks that no root finding blames hold ops
their peers finished (`frontier.lagging_ranks`), with each root that reads a hang off
where ranks stand (an op not issued, one issued beyond the peers, a send or recv never
posted, an op stuck) made an `in_flight` consequence of the job-wide note of the lagging
ranks (link "running": a warning that blames nobody), and that note the warning that says
why, the notes of where ranks lag its details (link "lagging").

A hang that lasted until the dumps is settled: every op that can finish has finished on
every member, so no rank holds an op a peer finished unless its GPU stopped reporting, and
such a rank is to blame. A job dumped while it ran is not: each rank's dump is a picture of
its own moment, a rank dumped a few milliseconds before its peers shows them gone on
without it, and where one rank stands against another says nothing of a hang.
"""

from __future__ import annotations

from frtrace.diagnosis.finding import Finding
from frtrace.diagnosis.frontier import DUMPED_AT_OTHER_MOMENTS, LAGGING_RANKS
from frtrace.wording import some_ranks_text

# The kinds a rank's place against its peers tells: wrong where dumps are of other moments.
_READ_OFF_PLACES = frozenset({"not_issued", "extra_op", "p2p_unmatched", "stuck"})


def unsettled_roots(findings: list[Finding]) -> list[Finding]:
    """The rule: where ranks lag that no root blames, the job was running when dumped, and
    the roots that read a hang off where ranks stand blame nobody and leave it inconclusive."""
    lagging = next((f for f in findings if f.rule == LAGGING_RANKS), None)
    if lagging is None:
        return findings
    blamed = {rank for f in findings if f.is_root for rank in f.own_suspects}
    running = tuple(rank for rank in lagging.ranks if rank not in blamed)
    if not running:
        return findings
    left_open = [f for f in findings if f.is_root and f.own_suspects and f.kind in _READ_OFF_PLACES]
    if left_open:
        _say_it_ran(lagging, running, left_open)
    for finding in left_open:
        _leave_open(finding, lagging)
    for note in findings:  # the places the ranks lag at: the job-wide warning's details
        if note.rule == DUMPED_AT_OTHER_MOMENTS and note.is_root:
            note.caused_by, note.link = lagging, "lagging"
    return findings


def _leave_open(finding: Finding, lagging: Finding) -> None:
    """The finding follows from the job-wide warning (link "running"): a warning that
    blames nobody, folded with the other consequences, what it would say kept."""
    finding.facts.update(kind_if_settled=finding.kind, suspects_if_settled=list(finding.own_suspects))
    finding.kind = "in_flight"
    finding.caused_by, finding.link = lagging, "running"


def _say_it_ran(lagging: Finding, running: tuple[int, ...], left_open: list[Finding]) -> None:
    one = len(running) == 1
    would_blame = tuple(sorted({rank for f in left_open for rank in f.own_suspects}))
    lagging.own_severity = "warning"
    lagging.facts["running_ranks"] = list(running)
    lagging.statement = (
        f"the job was still running when dumped: {some_ranks_text(running)}, blamed by nothing, "
        f"{'holds' if one else 'hold'} ops unfinished that {'its' if one else 'their'} peers finished, which a hang "
        "that lasted until the dumps leaves only on a rank whose GPU stopped; so each rank's dump is of its own "
        f"moment, and {'the finding' if len(left_open) == 1 else f'the {len(left_open)} findings'} that would blame "
        f"{some_ranks_text(would_blame)} for where {'it stands' if len(would_blame) == 1 else 'they stand'} blame nobody")
