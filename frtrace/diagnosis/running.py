"""Whether the dumps picture a job that was still running, and what is left then of a hang.

Takes the linked findings; returns them, where ranks that no root finding blames hold ops
their peers finished (`frontier.lagging_ranks`), with each root that reads a hang off
where ranks stand (an op not issued, one issued beyond the peers, a send or recv never
posted, an op stuck) made a warning that blames nobody.

A hang that lasted until the dumps is settled: every op that can finish has finished on
every member, so no rank holds an op a peer finished unless its GPU stopped reporting, and
such a rank is to blame. A job dumped while it ran is not: each rank's dump is a picture of
its own moment, a rank dumped a few milliseconds before its peers shows them gone on
without it, and where one rank stands against another says nothing of a hang.
"""

from __future__ import annotations

from typing import Optional

from frtrace.diagnosis.finding import Finding
from frtrace.diagnosis.frontier import LAGGING_RANKS
from frtrace.wording import ranks_text

# The kinds a rank's place against its peers tells: wrong where dumps are of other moments.
_READ_OFF_PLACES = frozenset({"not_issued", "extra_op", "p2p_unmatched", "stuck"})


def unsettled_roots(findings: list[Finding]) -> list[Finding]:
    """The rule: where ranks lag that no root blames, the job was running when dumped, and
    the roots that read a hang off where ranks stand blame nobody and leave it inconclusive."""
    running = _running_ranks(findings)
    if running:
        for finding in findings:
            if finding.is_root and finding.own_suspects and finding.kind in _READ_OFF_PLACES:
                _leave_open(finding, running)
    return findings


def _running_ranks(findings: list[Finding]) -> Optional[tuple[int, ...]]:
    """The lagging ranks that no root finding blames: ranks that went on running."""
    lagging = next((f.ranks for f in findings if f.rule == LAGGING_RANKS), ())
    blamed = {rank for f in findings if f.is_root for rank in f.own_suspects}
    return tuple(rank for rank in lagging if rank not in blamed) or None


def _leave_open(finding: Finding, running: tuple[int, ...]) -> None:
    suspects = finding.own_suspects
    finding.facts["suspects_if_settled"] = list(suspects)
    finding.facts["running_ranks"] = list(running)
    finding.own_suspects = ()
    finding.own_severity = "warning"
    finding.statement += (f"; but the job was still running when dumped ({ranks_text(running)}, blamed by nothing, "
                          f"{'holds ops its' if len(running) == 1 else 'hold ops their'} peers finished): "
                          f"{ranks_text(suspects)} may have been dumped a moment before {'it' if len(suspects) == 1 else 'they'} "
                          "got there")
