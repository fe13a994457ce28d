"""Where is each rank? The per-rank view asked for right after the verdict.

Takes an `Analysis` (the device view: each rank's entries up to the op it is blocked
in); returns `RankStanding` per rank and, folded, `StandingRow`s: ranks that stand
alike (same blocked op and state, same last completed op, same lag behind their
peers, same kinds of groups) share one row, so 4,096 ranks fit in a few dozen rows.

Groups are compared by *class*: a group whose description and size other groups share
(the TP groups of a TP x PP x DP job) belongs to the class of that family ("tp"), so
rank 0 blocked in its TP group's all_gather #12 stands like rank 8 in its own TP
group's #12. A group with no such siblings is a class of its own.

Plain data out; the text, markdown, JSON and HTML renderers read it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from frtrace.match.analysis import Analysis
from frtrace.model import Entry, Group
from frtrace.table.rank_dump import clocks_compare
from frtrace.table.standing import blocked_at

# standing of a rank
BLOCKED = "blocked"  # holds an op it has not finished (the oldest one after its newest finished one)
IDLE = "idle"  # every op it holds finished
NO_ENTRIES = "no_entries"  # a dump without collectives (or an empty one)
NO_DUMP = "no_dump"  # no usable dump file
STANDING_ORDER = {BLOCKED: 0, IDLE: 1, NO_ENTRIES: 2, NO_DUMP: 3}
# What tells a class of groups: ("family", desc, size) | ("group", group id) | ("name", pg_name).
ClassKey = Union[tuple[str, str, int], tuple[str, int], tuple[str, str]]
# What tells one op held apart from another (OpAt.fold_key): op, class, seqs and state.
OpKey = tuple[str, ClassKey, Optional[int], Optional[int], str]


@dataclass(frozen=True, slots=True)
class GroupClass:
    """A group, or a family of sibling groups (same description and size)."""

    key: ClassKey  # ("family", desc, size) | ("group", group id) | ("name", pg_name)
    desc: str
    order: int  # lowest group id of the class: columns and lists follow it

    @property
    def is_family(self) -> bool:
        return self.key[0] == "family"


@dataclass(frozen=True, slots=True)
class OpAt:
    """One op as a rank holds it: which op, at which sequence number, in which group, in what state."""

    op: str
    group_class: GroupClass
    pg_name: str
    pg_desc: str
    collective_seq_id: Optional[int]  # None for a send or recv
    p2p_seq_id: Optional[int]  # None for a collective
    state: str

    @property
    def fold_key(self) -> OpKey:
        return (self.op, self.group_class.key, self.collective_seq_id, self.p2p_seq_id, self.state)


@dataclass(frozen=True, slots=True)
class RankStanding:
    rank: int
    standing: str  # BLOCKED | IDLE | NO_ENTRIES | NO_DUMP
    blocked_in: Optional[OpAt]
    # How long before the newest op creation time in the job the blocked op was
    # created (None: unknown, or not blocked). Clocks of different hosts may differ.
    since_ns: Optional[int]
    last_completed: Optional[OpAt]
    # group id -> (this rank's newest collective_seq_id there, the newest any member issued)
    positions: dict[int, tuple[int, int]]
    behind: tuple[tuple[GroupClass, int], ...]  # ((GroupClass, collectives behind), ...) where it is behind its peers


@dataclass(frozen=True, slots=True)
class GroupCell:
    """Where the ranks of one row stand in one class of groups."""

    group_class: GroupClass
    pg_names: tuple[str, ...]  # the groups of the class these ranks are in
    newest: Optional[tuple[int, int]]  # (min, max) of the ranks' newest collective_seq_id; None when unknown
    behind: int  # collectives behind the group's newest (the same for every rank of the row)
    blocked_here: bool
    last_completed_here: bool


@dataclass(frozen=True, slots=True)
class StandingRow:
    """Ranks that stand alike."""

    ranks: tuple[int, ...]  # sorted global ranks
    standing: str
    blocked_in: Optional[OpAt]  # the first rank's (pg_name may differ across the row: see groups_of)
    blocked_groups: tuple[str, ...]  # names of the groups the row's ranks are blocked in
    since_ns: Optional[tuple[int, int]]  # (min, max) over ranks whose time is known
    last_completed: Optional[OpAt]
    last_completed_groups: tuple[str, ...]
    behind: tuple[tuple[GroupClass, int, tuple[str, ...]], ...]  # ((GroupClass, collectives behind, group names), ...)
    cells: tuple[GroupCell, ...]  # per class of groups the ranks are members of, in class order
    suspect: bool  # holds a primary suspect of the diagnosis


@dataclass(frozen=True, slots=True)
class RankView:
    """The folded per-rank view of a job."""

    rows: tuple[StandingRow, ...]  # suspects first, then by first rank
    classes: tuple[GroupClass, ...]  # in column order
    class_names: tuple[tuple[str, ...], ...]  # per class (same order): the names of its groups
    completion_word: str  # "completed", or "retired" when the dumps do not say when ops finish (gloo)
    newest_created_ns: Optional[int]

    @property
    def rank_count(self) -> int:
        return sum(len(row.ranks) for row in self.rows)


# --------------------------------------------------------------------------- per rank


def group_classes(analysis: Analysis) -> dict[int, GroupClass]:
    """group id -> GroupClass."""
    groups = analysis.layout.groups
    family_size = Counter((g.desc, g.size) for g in groups if g.desc)

    def key_of(group: Group) -> ClassKey:
        if group.desc and family_size[(group.desc, group.size)] > 1:
            return ("family", group.desc, group.size)
        return ("group", group.id)

    first_of: dict[ClassKey, int] = {}
    for group in groups:
        first_of.setdefault(key_of(group), group.id)
    return {g.id: GroupClass(key_of(g), g.desc, first_of[key_of(g)]) for g in groups}


class _Namer:
    """Entry -> OpAt, through the layout's groups."""

    def __init__(self, analysis: Analysis, classes: dict[int, GroupClass]) -> None:
        self.layout = analysis.layout
        self.classes = classes
        self.stray: dict[str, GroupClass] = {}

    def op_at(self, entry: Entry, rank: int) -> OpAt:
        gid = self.layout.group_of(entry.pg_name, rank)
        if gid is not None:
            group_class = self.classes[gid]
            name, desc = self.layout.groups[gid].name, self.layout.groups[gid].desc
        else:  # an entry of a group the layout does not know (should not happen): a class of its own
            group_class = self.stray.setdefault(entry.pg_name, GroupClass(("name", entry.pg_name), entry.pg_desc,
                                                                          len(self.layout.groups) + len(self.stray)))
            name, desc = entry.pg_name, entry.pg_desc
        return OpAt(entry.op, group_class, name, desc,
                    None if entry.is_p2p else entry.collective_seq_id,
                    entry.p2p_seq_id if entry.is_p2p else None, entry.state)


def _positions(analysis: Analysis) -> dict[int, dict[int, tuple[int, int]]]:
    """rank -> {group id: (its newest collective seq, the group's newest)} from the device view.
    A member's newest is its newest entry of the group, else what its pg_status says it
    enqueued; members that say neither are left out."""
    positions: defaultdict[int, dict[int, tuple[int, int]]] = defaultdict(dict)
    for view in analysis.device.views:
        newest = {}
        members = frozenset(view.group.ranks)  # the default group lists every rank: a tuple would cost ranks^2
        for rank, stream in view.streams.items():
            if rank not in members:
                continue
            seq = stream.last_seq if stream.last_seq is not None else stream.enqueued
            if seq is not None and seq >= 0:
                newest[rank] = seq
        if not newest:
            continue
        top = max(newest.values())
        for rank, seq in newest.items():
            positions[rank][view.group.id] = (seq, top)
    return positions


def rank_standings(analysis: Analysis) -> list[RankStanding]:
    """One RankStanding per rank of the job (with or without a dump), by rank."""
    classes = group_classes(analysis)
    namer = _Namer(analysis, classes)
    positions = _positions(analysis)
    newest_created = _newest_created(analysis)
    standings = []
    for dump in analysis.device_dumps:
        entries = dump.entries
        where = positions.get(dump.rank, {})
        behind = _behind(where, classes)
        if not entries:
            standings.append(RankStanding(dump.rank, NO_ENTRIES, None, None, None, where, behind))
            continue
        index = blocked_at(entries)
        blocked = entries[index] if index < len(entries) else None
        last = entries[index - 1] if index > 0 else None
        since = None
        if blocked is not None and blocked.time_created_ns > 0 and newest_created is not None:
            since = max(0, newest_created - blocked.time_created_ns)
        standings.append(RankStanding(
            dump.rank, BLOCKED if blocked is not None else IDLE,
            namer.op_at(blocked, dump.rank) if blocked is not None else None, since,
            namer.op_at(last, dump.rank) if last is not None else None, where, behind))
    for rank in analysis.layout.ranks_missing:
        standings.append(RankStanding(rank, NO_DUMP, None, None, None, {}, ()))
    standings.sort(key=lambda s: s.rank)
    return standings


def _newest_created(analysis: Analysis) -> Optional[int]:
    """The newest op creation time of the job (ranks enqueue in time order, so each rank's last entry);
    None when the dumps' clocks cannot be compared across ranks (CUPTI's native clock)."""
    if not clocks_compare(analysis.dumps):
        return None
    newest = [d.entries.value("time_created_ns", len(d.entries) - 1) for d in analysis.dumps if d.entries]
    times = [t for t in newest if t > 0]
    return max(times) if times else None


def _behind(where: dict[int, tuple[int, int]], classes: dict[int, GroupClass]) -> tuple[tuple[GroupClass, int], ...]:
    lag: dict[GroupClass, int] = {}
    for gid, (seq, top) in where.items():
        if seq < top:
            group_class = classes[gid]
            lag[group_class] = max(lag.get(group_class, 0), top - seq)
    return tuple(sorted(lag.items(), key=lambda item: item[0].order))


# --------------------------------------------------------------------------- folded

# Ranks with the same key stand alike: standing, blocked op, last completed op, lag per
# class, the classes they are members of, and whether they are suspects.
_RowKey = tuple[str, Optional[OpKey], Optional[OpKey], tuple[tuple[ClassKey, int], ...], frozenset[ClassKey], bool]


def rank_view(analysis: Analysis, suspects: Iterable[int] = (),
              standings: Optional[list[RankStanding]] = None) -> RankView:
    """The per-rank view, folded: rows of ranks that stand alike, rows holding a suspect
    first, then by their first rank. Deterministic for the same dumps. `standings`:
    `rank_standings(analysis)` when worked out already."""
    if standings is None:
        standings = rank_standings(analysis)
    classes = group_classes(analysis)
    names = {g.id: g.name for g in analysis.layout.groups}
    suspects = set(suspects)
    by_key: defaultdict[_RowKey, list[RankStanding]] = defaultdict(list)
    for standing in standings:
        member_of = frozenset(classes[gid].key for gid in standing.positions)
        key = (standing.standing,
               standing.blocked_in.fold_key if standing.blocked_in else None,
               standing.last_completed.fold_key if standing.last_completed else None,
               tuple((c.key, lag) for c, lag in standing.behind),
               member_of,
               # A suspect never shares a row with ranks that are not: "0-3 *" would read
               # as four suspects.
               standing.rank in suspects)
        by_key[key].append(standing)
    rows = [_fold(members, classes, names, suspects) for members in by_key.values()]
    rows.sort(key=lambda row: (not row.suspect, row.ranks[0]))
    ordered_classes = sorted({c.key: c for c in classes.values()}.values(), key=lambda c: c.order)
    class_names = tuple(sorted_names(names[gid] for gid, c in classes.items() if c.key == oc.key) for oc in ordered_classes)
    completion_word = "completed" if analysis.reliable else "retired"
    return RankView(tuple(rows), tuple(ordered_classes), class_names, completion_word, _newest_created(analysis))


def _fold(members: list[RankStanding], classes: dict[int, GroupClass], names: dict[int, str],
          suspects: set[int]) -> StandingRow:
    """One row for ranks that stand alike (`members`, by rank)."""
    first = members[0]
    ranks = tuple(s.rank for s in members)
    times = [s.since_ns for s in members if s.since_ns is not None]
    group_names: defaultdict[ClassKey, set[str]] = defaultdict(set)  # class key -> names of the members' groups
    newest: dict[ClassKey, tuple[int, int]] = {}  # class key -> (min, max) newest seq of the members there
    for standing in members:
        for gid, (seq, _top) in standing.positions.items():
            key = classes[gid].key
            group_names[key].add(names[gid])
            low, high = newest.get(key, (seq, seq))
            newest[key] = (min(low, seq), max(high, seq))
    lag_of = {c.key: lag for c, lag in first.behind}
    cells = tuple(
        GroupCell(c, sorted_names(group_names[c.key]), newest.get(c.key), lag_of.get(c.key, 0),
                  first.blocked_in is not None and first.blocked_in.group_class.key == c.key,
                  first.last_completed is not None and first.last_completed.group_class.key == c.key)
        for c in sorted({classes[gid] for s in members for gid in s.positions}, key=lambda c: c.order))
    return StandingRow(
        ranks, first.standing, first.blocked_in,
        sorted_names(s.blocked_in.pg_name for s in members if s.blocked_in),
        (min(times), max(times)) if times else None,
        first.last_completed,
        sorted_names(s.last_completed.pg_name for s in members if s.last_completed),
        tuple((c, lag, sorted_names(group_names[c.key])) for c, lag in first.behind),
        cells, any(r in suspects for r in ranks))


def sorted_names(names: Iterable[str]) -> tuple[str, ...]:
    """Distinct group names, numeric ones in numeric order first."""
    return tuple(sorted(set(names), key=lambda n: (0, int(n), "") if n.isascii() and n.isdigit() else (1, 0, n)))
