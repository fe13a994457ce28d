"""Missing dumps and empty ones: ranks the dumps cannot speak for.

Takes `Facts` (and, for the notes that depend on them, the findings so far); returns
`missing_dump` notes for ranks without a usable dump that no finding already blames,
and `no_entries` notes for dumps that hold no entries.
"""

from __future__ import annotations

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.wording import ranks_text


def unaccounted_missing_ranks(facts: Facts, findings: list[Finding]) -> list[Finding]:
    """The rule: ranks without a dump that no finding already blames or mentions."""
    analysis = facts.analysis
    # Blamed by a finding, or already weighed as a missing dump by one (which may clear them).
    mentioned = {r for f in findings for r in f.suspect_ranks}
    mentioned.update(r for f in findings if f.kind == "missing_dump" for r in f.ranks)
    missing = [r for r in analysis.layout.ranks_missing if r not in mentioned]
    if not missing:
        return []
    blamed = any(f.severity == "error" and f.is_root for f in findings)
    failed = set(analysis.load.failed_ranks)
    reason = "unreadable dump" if set(missing) <= failed else "no dump file"
    one = len(missing) == 1
    message = f"{ranks_text(missing)}: {reason}" + (
        f"; the evidence points elsewhere, so {'it is probably a victim' if one else 'they are probably victims'}"
        if blamed else f"; nothing else shows what {'it was' if one else 'they were'} doing"
    )
    return [new_finding("missing_dump", "missing.unaccounted_missing_ranks", None, severity="info" if blamed else "warning",
                        op=None, collective_seq_id=None, p2p_seq_id=None, ranks=tuple(missing), suspect_ranks=(),
                        message=message, evidence={"ranks": list(missing), "unreadable": sorted(failed & set(missing))})]


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
