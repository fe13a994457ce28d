"""One finding per P2P pair that two rules explain.

Takes the findings of the rules that look at P2P pairs (`p2p_sizes.mismatched_pairs`,
`p2p.posted_pairs` and the rest); returns them with at most one root finding per pair:
the size checks compare every pair a channel moved, the posted-pairs rule reasons on a
ring's members, and both may come to the same pair (group and P2P sequence number, the
same ranks involved). Two roots for one fact would read as two faults; the one that
names fewer suspects is kept (the narrower blame is the one the other's evidence allows),
a ring step named as skipped before an equal one, and the other rule is recorded in the
kept finding's facts (`also_found_by`).
"""

from __future__ import annotations

from frtrace.diagnosis.finding import Finding

# Findings about one P2P pair that these rules make.
PAIR_KINDS = frozenset({"size_mismatch", "dtype_mismatch", "p2p_unmatched", "not_issued"})
# Rules about a pipeline's pairs, whose ranks number their P2P ops each on its own: two
# findings at one number are about one pair only where their ends are the same.
BY_ENDS = frozenset({"p2p.left_out_step"})


def _pair_of(finding: Finding) -> tuple[int, int] | None:
    if finding.p2p_seq_id is None or finding.group_id is None or finding.kind not in PAIR_KINDS:
        return None
    return finding.group_id, finding.p2p_seq_id


def _preference(finding: Finding, position: int) -> tuple[int, int, int]:
    return len(finding.suspect_ranks or finding.ranks), 0 if finding.rule == "p2p.skipped_ring_step" else 1, position


def one_finding_per_pair(findings: list[Finding]) -> list[Finding]:
    """The rule (see module docstring)."""
    by_pair: dict[tuple[int, int], list[int]] = {}
    for position, finding in enumerate(findings):
        pair = _pair_of(finding)
        if pair is not None:
            by_pair.setdefault(pair, []).append(position)
    dropped: set[int] = set()
    for positions in by_pair.values():
        if len(positions) < 2:  # as a rule
            continue
        kept = min(positions, key=lambda p: _preference(findings[p], p))
        keeper = findings[kept]
        for position in positions:
            other = findings[position]
            if position == kept or other.rule == keeper.rule or not set(other.ranks) & set(keeper.ranks):
                continue
            if {other.rule, keeper.rule} & BY_ENDS and _ends(other) != _ends(keeper):
                continue
            dropped.add(position)
            keeper.facts.setdefault("also_found_by", []).append(other.rule)
    return [finding for position, finding in enumerate(findings) if position not in dropped]


def _ends(finding: Finding) -> tuple[int, int] | None:
    ends = finding.p2p_ends
    return None if ends is None else (ends.src, ends.dst)
