"""Missing dumps and empty ones: ranks the dumps cannot speak for.

Takes `Facts` (and, for the notes that depend on them, the findings so far); returns
`missing_dump` notes for ranks without a usable dump that no finding already blames,
a `missing_dump` warning where the world size is only guessed from the file names and
an unfinished op could be waiting on a rank above them, and `no_entries` notes for
dumps that hold no entries.
"""

from __future__ import annotations

from typing import Iterable

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.wording import group_text, ranks_text


def _unmentioned(ranks_missing: Iterable[int], findings: list[Finding]) -> list[int]:
    """The ranks without a dump that no finding blames, or already weighed as a missing
    dump (which may clear them)."""
    mentioned = {r for f in findings for r in f.suspect_ranks}
    mentioned.update(r for f in findings if f.kind == "missing_dump" for r in f.ranks)
    return [r for r in ranks_missing if r not in mentioned]


def _missing_message(missing: list[int], reason: str, blamed: bool) -> str:
    one = len(missing) == 1
    return f"{ranks_text(missing)}: {reason}" + (
        f"; the evidence points elsewhere, so {'it is probably a victim' if one else 'they are probably victims'}"
        if blamed else f"; nothing else shows what {'it was' if one else 'they were'} doing"
    )


def unaccounted_missing_ranks(facts: Facts, findings: list[Finding]) -> list[Finding]:
    """The rule: ranks without a dump that no finding already blames or mentions."""
    analysis = facts.analysis
    missing = _unmentioned(analysis.layout.ranks_missing, findings)
    if not missing:
        return []
    blamed = any(f.severity == "error" and f.is_root for f in findings)
    failed = set(analysis.load.failed_ranks)
    reason = "unreadable dump" if set(missing) <= failed else "no dump file"
    message = _missing_message(missing, reason, blamed)
    return [new_finding("missing_dump", "missing.unaccounted_missing_ranks", None, severity="info" if blamed else "warning",
                        op=None, collective_seq_id=None, p2p_seq_id=None, ranks=tuple(missing), suspect_ranks=(),
                        message=message, evidence={"ranks": list(missing), "unreadable": sorted(failed & set(missing))})]


def unseen_top_ranks(facts: Facts, findings: list[Finding]) -> list[Finding]:
    """The rule: gloo's pg_config lists no ranks, so with no other clue the world is sized by
    the highest rank in a file name, and a top rank that left no dump does not show. Where
    every member with a dump holds a group's op unretired (a `stuck` note on gloo, which
    gives no other progress signal), that op may be waiting on such a rank: the dumps cannot
    tell, so say so (a warning: inconclusive) instead of calling the job healthy. Groups whose
    members a pg_config lists are not in doubt."""
    layout = facts.analysis.layout
    if layout.world_source != "files":
        return []
    views = {view.group.id: view for view in facts.device.views}
    unseen = []
    for finding in findings:
        view = views.get(finding.group_id) if finding.group_id is not None else None
        if (finding.kind != "stuck" or finding.severity != "info" or view is None
                or view.group.membership_source == "pg_config"):
            continue
        world = layout.world_size
        unseen.append(new_finding(
            "missing_dump", "missing.unseen_top_ranks", view, severity="warning", op=finding.op,
            collective_seq_id=finding.collective_seq_id, p2p_seq_id=None, ranks=finding.ranks, suspect_ranks=(),
            message=(f"{ranks_text(finding.ranks)} {'holds' if len(finding.ranks) == 1 else 'hold'} {finding.op} "
                     f"#{finding.collective_seq_id} of {group_text(view.group.name, view.group.desc)} unretired, and the "
                     f"world size ({world}) is only guessed from the file names (the dumps' pg_config lists no ranks): "
                     f"a rank above {world - 1} that left no dump may be what {'it waits' if len(finding.ranks) == 1 else 'they wait'} "
                     "for (--world-size N says the job's size)"),
            evidence={"waiting_ranks": list(finding.ranks), "world_size": world, "world_size_source": "files"},
            waiting_ranks=finding.ranks, age_ns=finding.age_ns,
        ))
    return unseen


def empty_dumps(facts: Facts) -> list[Finding]:
    """The rule: dumps with no entries say nothing about collectives; make that visible."""
    dumps = facts.analysis.dumps
    empty = [d.rank for d in dumps if not d.entries]
    if not empty:
        return []
    without_key = [d.rank for d in dumps if not d.entries and not d.has_entries]
    why = " (dumped without collectives: includeCollectives=False)" if without_key == empty else ""
    return [new_finding("no_entries", "missing.empty_dumps", None, severity="info", op=None, collective_seq_id=None,
                        p2p_seq_id=None, ranks=tuple(empty), suspect_ranks=(),
                        message=f"{ranks_text(empty)}: the dump holds no entries{why}", evidence={"ranks": empty})]
