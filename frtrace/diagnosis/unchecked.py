"""What could not be compared: unknown is not agreement.

Takes `Facts`; returns `not_compared` findings, one per group with collectives some of
whose entries could not be read (an op name that is not a string, sizes or dtypes in no
shape the loader accepts). The matcher compares what is known of such entries (the op
name, the element counts it could read); this says what it could not. Where no two
members' ops could be compared at all, the collective was never checked: a warning
(the job is then inconclusive, never "healthy"); where only some sizes or dtypes were
unread, a note.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.match.matcher import CollectiveMatch, GroupView
from frtrace.model import SHAPE_FIELDS, UNREADABLE_OP, Entry
from frtrace.util import fold_ranks
from frtrace.table.entry_table import StaticRow
from frtrace.wording import group_text, ranks_text

_EXAMINED = 64  # collectives per group read entry by entry


def _unread_parts(entry: Entry) -> Optional[tuple[str, ...]]:
    """What of the entry could not be read: None when its op could not, else the names of
    its unread size and dtype fields (() when all were read)."""
    if entry.name == UNREADABLE_OP:
        return None
    shapes = entry.shapes
    return () if shapes.readable else (shapes.unread or SHAPE_FIELDS)


def _is_unreadable(static: StaticRow) -> bool:
    name, shapes = static.name, static.shapes
    return not name.is_p2p and not name.is_coalesced_marker and (name == UNREADABLE_OP or not shapes.readable)


def unreadable_entries(facts: Facts) -> list[Finding]:
    """The rule: per group, the collectives whose entries could not all be read (see
    module docstring)."""
    layout = facts.analysis.layout
    places: dict[int, set[int]] = defaultdict(set)  # group id -> sequence numbers
    for dump in facts.seen:
        table = dump.entries

        def judge(static: StaticRow, rank: int = dump.rank) -> Optional[int]:
            """The group of an entry that could not be read, where it is known."""
            return layout.group_of(static.pg_name, rank) if _is_unreadable(static) else None

        odd = table.rows_where(judge)
        if not odd:  # as a rule
            continue
        for (_, group_id), seq in zip(odd, table.field_at("collective_seq_id", [row for row, _ in odd])):
            places[group_id].add(seq)
    findings = []
    for view in facts.device.views:
        seqs = places.get(view.group.id)
        if seqs:
            matches = [m for m in map(facts.index.at.get, ((view.group.id, s) for s in sorted(seqs))) if m is not None]
            finding = _group_finding(view, [m for m in matches if len(m.calls) >= 2])
            if finding is not None:
                findings.append(finding)
    return findings


def _read_calls(match: CollectiveMatch, partly: dict[int, set[str]], unread_ranks: set[int]) -> int:
    """How many members' ops of `match` could be read (in part, at least); adds the ranks
    with something unread to `unread_ranks`, and the fields unread to `partly`."""
    readable_ops = 0
    for rank, entries in match.calls.items():
        parts = [_unread_parts(e) for e in entries if not e.name.is_coalesced_marker]
        if any(p is None for p in parts):
            unread_ranks.add(rank)
            continue
        readable_ops += 1
        fields = {field for p in parts if p for field in p}
        if fields:
            unread_ranks.add(rank)
            partly[rank] |= fields
    return readable_ops


def _message(group: str, blind: list[CollectiveMatch], partly: dict[int, set[str]], ranks: tuple[int, ...],
             seqs: list[int]) -> tuple[str, str]:
    """(message, severity): a warning where some collective had no two members' ops
    compared (`blind`), else a note of the fields compared only in part."""
    if blind:
        first = blind[0]
        message = (f"#{first.seq} in {group} could not be checked: the op of {ranks_text(_blind_ranks(first))} "
                   f"could not be read, so no two members' ops were compared (not agreed)"
                   + (f"; {len(blind) - 1} more such collective(s) among the first {_EXAMINED} read"
                      if len(blind) > 1 else ""))
        return message, "warning"
    unread = sorted({field for fs in partly.values() for field in fs})
    message = (f"{len(seqs)} collective(s) of {group} (#{fold_ranks(seqs)}) were compared by what could be read "
               f"only: the {', '.join(unread)} of {ranks_text(ranks)} could not be read")
    return message, "info"


def _group_finding(view: GroupView, matches: list[CollectiveMatch]) -> Optional[Finding]:
    """The finding about a group's collectives `matches`, each with an unread entry; the
    first _EXAMINED are read entry by entry (a dump of garbage may hold thousands)."""
    blind: list[CollectiveMatch] = []  # no two members' ops compared
    partly: dict[int, set[str]] = defaultdict(set)  # rank -> fields of it not compared
    unread_ranks: set[int] = set()
    for match in matches[:_EXAMINED]:
        if _read_calls(match, partly, unread_ranks) < 2:
            blind.append(match)
    if not unread_ranks:
        return None
    group = group_text(view.group.name, view.group.desc)
    ranks = tuple(sorted(unread_ranks))
    seqs = [m.seq for m in matches]
    message, severity = _message(group, blind, partly, ranks, seqs)
    evidence = {"collectives": fold_ranks(seqs), "examined": min(len(matches), _EXAMINED),
                "unchecked_collectives": [m.seq for m in blind],
                "unread_fields": {str(rank): sorted(fields) for rank, fields in sorted(partly.items())}}
    anchor = (blind or matches)[0]
    return new_finding("not_compared", "unchecked.unreadable_entries", view, op=None,
                       collective_seq_id=anchor.seq, p2p_seq_id=None, ranks=ranks, suspect_ranks=(),
                       message=message, evidence=evidence, severity=severity)


def _blind_ranks(match: CollectiveMatch) -> tuple[int, ...]:
    return tuple(rank for rank, entries in match.calls.items() if any(e.name == UNREADABLE_OP for e in entries))
