"""Pair operations across ranks, per group, by sequence number.

Takes the `RankDump`s and the `Layout`; returns a `MatchResult`:
- a `GroupView` per group: each member's entries indexed by `collective_seq_id`
  (a coalesced batch stays together under its one id) plus its P2P entries, and the
  window of sequence numbers its ring buffer still holds;
- a `CollectiveMatch` per (group, seq) seen anywhere, saying which members issued it,
  which never did, which cannot tell (their buffer no longer reaches back, or they
  have no dump), and whether the members agree on op, sizes and dtypes;
- a `P2PMatch` per send/recv pair, paired in order on each (group, src, dst) channel.

Never by `record_id` or file position. Each rank's entries are dealt into their groups
once (`deal`, which the pipeline runs while other files still load), building hash
indexes; every comparison afterwards is a lookup. Collectives every member issued alike
and completed are settled a column at a time, comparing the values the loader shares
across ranks (mostly an identity check); the rest are judged rank by rank from the same
keys (op, shapes and state of each rank's entries, read off its codes), without
building an Entry.

A group is matched in two steps: planned (`GroupPlan`: the numbers, the collectives not
settled at a glance judged, the P2P channels' pairs of rows; plain ints) and built (the
matches, from the plan). With processes to spare, forked children plan a large job's
groups while this process plans its share (`_plans_apart`); it builds every match,
each share's as it comes in.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import ClassVar, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence, Union

from frtrace.load.forked import each_in_children, may_fork
from frtrace.load.layout import Layout, is_default_group
from frtrace.model import (
    SHAPE_FIELDS,
    UNREADABLE_OP,
    Entry,
    Family,
    Group,
    OpName,
    PgStatus,
    Shapes,
    family_of,
    numel,
)
from frtrace.table.batches import batch_at_the_cut
from frtrace.table.by_group import GroupParts, deal_by_group
from frtrace.table.entry_table import EntryTable
from frtrace.table.rank_dump import RankDump
from frtrace.table.seq_map import (
    NOT_SINGLE,
    BatchKey,
    LazyCalls,
    NumberKey,
    OpKey,
    OpKeys,
    RowList,
    SeqMap,
)
from frtrace.table.standing import mixes_numberings, only_active_job

# The pg_id of the default group, the first group each rank creates.
DEFAULT_PG_ID = 0

_NAME_SHAPES = operator.attrgetter("name", "shapes")
# Expected where the first rank holds no single entry: equal to no key, so never settled.
_NEVER = object()

# Ops whose sizes legitimately differ per rank (uneven splits, variable counts).
RANK_DEPENDENT_SIZE_OPS = frozenset(
    {"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_to_all_v_single", "all_gather_v", "reduce_scatter_v"}
)
# Only the root holds real data on one side of these.
ROOT_ONLY_INPUT_OPS = frozenset({"scatter"})
ROOT_ONLY_OUTPUT_OPS = frozenset({"gather"})


@dataclass(slots=True)
class RankStream:
    """One rank's entries in one group."""

    rank: int
    collectives: SeqMap  # collective_seq_id -> tuple[Entry, ...]
    p2p: RowList  # P2P entries, oldest first
    first_seq: Optional[int]
    last_seq: Optional[int]
    # The rank's ring buffer wrapped: sequence numbers before first_seq fell off it.
    clipped: bool
    # Some of the rank's entries could not be read, so a gap may be one of them.
    uncertain: bool = False
    # p2p_seq_ids of the rank's P2P batches: a batched op and a plain one never pair, as
    # torch runs plain sends and receives on a communicator of their own.
    batched: frozenset[int] = frozenset()
    # From the rank's pg_status, in collective numbers (None when it does not say, or
    # says it in P2P numbers): the newest collective it enqueued and finished. They tell
    # where it stands even when its buffer no longer holds any entry of the group.
    enqueued: Optional[int] = None
    finished: Optional[int] = None
    # The rank's own pg_id for the group (rank-local: see _own_pg_ids), None when unknown.
    pg_id: Optional[int] = None
    # The job's dumps keep only active entries: what the rank does not hold, it finished
    # or never issued (pg_status may say which).
    only_active: bool = False
    # It holds every P2P op it posted in the group, from its first (see _batches_held):
    # its channels pair in order, whatever its collectives lost.
    p2p_whole: bool = False
    # The device view left out ops of the group that the rank queued behind the one it is
    # blocked in (it held some of the group's collectives in its whole dump).
    left_queued: bool = False
    # Where the rank's own pg_id for the group is unknown: the most any of its pg_status
    # rows that may be the group's says it finished (`_finished_unplaced`). None when no
    # row may be.
    finished_unplaced: Optional[int] = None

    def absence(self, seq: int) -> str:
        """Why the rank holds no entry for collective `seq`: "not_issued", "finished"
        (done and gone: its buffer wrapped or keeps only active entries) or "unknown"."""
        if self.enqueued is not None and seq > self.enqueued:
            return "not_issued"
        if self.finished is not None and seq <= self.finished:
            return "finished"
        if self.only_active and not self.left_queued and self.enqueued is not None and seq <= self.enqueued:
            # It enqueued the op and keeps every op it has not finished: it finished it.
            # Its pg_status may say it finished less, as the watchdog counts what it saw
            # finish at its last poll, while the dump asks each op's events itself.
            return "finished"
        if self.only_active and self.left_queued and (self.finished is not None or self.enqueued is not None):
            # Past what it finished (maybe nothing yet): had it enqueued the op, its whole
            # dump would hold it (it keeps unfinished ops), queued behind the op the rank is
            # blocked in; or it never issued it. Either way its GPU never got it.
            return "not_issued"
        if self.only_active and not self.left_queued and self.first_seq is None and not self.uncertain:
            # It holds no collective of the group and its pg_status does not place it: had
            # it finished the op, so would its peers, still in it; it never joined them.
            # Unless a row of its pg_status that may be the group's says it finished that
            # far: each rank dumps at its own moment, and its peers' dumps may be older.
            if self.finished_unplaced is not None and self.finished_unplaced >= seq:
                return "unknown"
            return "not_issued"
        if self.first_seq is None and not self.only_active and not self.uncertain and self._issued_before(seq):
            # It holds sends and recvs of the group but none of its collectives: its newest
            # P2P op came after fewer collectives than `seq`, and a whole dump keeps what
            # it issued after that op.
            return "not_issued"
        return "not_issued" if self.covers(seq) else "unknown"

    def _issued_before(self, seq: int) -> bool:
        """Whether the rank's newest P2P op of the group was posted before collective `seq`:
        torch records on each P2P entry the number of the group's last collective."""
        if not self.p2p:
            return False
        count = self.p2p.value_at(len(self.p2p) - 1, "collective_seq_id")
        return type(count) is int and 0 <= count < seq

    def covers(self, seq: int) -> bool:
        """Whether a missing entry for `seq` would mean the rank never issued it."""
        if self.uncertain:
            return False
        return not self.clipped or (self.first_seq is not None and seq >= self.first_seq)


@dataclass(slots=True)
class GroupView:
    group: Group
    streams: dict[int, RankStream]  # rank -> its stream, for ranks with a dump (members and any stray rank)
    no_dump: tuple[int, ...]  # members without a usable dump


@dataclass(slots=True)
class Disagreement:
    """Members issued different things at one sequence number."""

    kind: str  # op_mismatch | dtype_mismatch | size_mismatch
    majority_ranks: tuple[int, ...]  # the largest agreeing class ((), when it is a tie)
    odd_ranks: tuple[int, ...]  # everyone outside the majority (all of them on a tie)
    classes: tuple[tuple[tuple[int, ...], tuple["OpSignature", ...]], ...]  # (ranks, signature) per distinct signature, largest first
    tie: bool


@dataclass(slots=True)
class CollectiveMatch:
    group_id: int
    seq: int
    calls: LazyCalls  # rank -> its entries (several for a coalesced batch), read on demand
    not_issued: tuple[int, ...]  # members whose window covers seq but who have no entry for it
    out_of_window: tuple[int, ...]  # members whose buffer no longer reaches back to seq
    no_dump: tuple[int, ...]
    # Some rank that issued it has not completed it (the rules looking for where a group
    # stands read only these: most of a group's thousands of collectives are finished).
    unfinished: bool
    disagreement: Optional[Disagreement] = None
    _completed: Optional[tuple[int, ...]] = None
    # Members with no entry for it whose pg_status says they finished it.
    finished_unseen: tuple[int, ...] = ()

    @property
    def issued(self) -> tuple[int, ...]:
        return tuple(sorted(self.calls))

    @property
    def held_by_all_unfinished(self) -> bool:
        """Every member holds it (none is without an entry of it or a dump) and none has
        finished it: in flight, or stuck, for the whole group alike."""
        return (bool(self.calls) and self.unfinished and not self.completed_ranks and not self.finished_unseen
                and not self.not_issued and not self.out_of_window and not self.no_dump)

    @property
    def completed_ranks(self) -> tuple[int, ...]:
        if self._completed is None:
            self._completed = tuple(sorted(
                rank for rank, entries in self.calls.items()
                if (entries[0].completed if len(entries) == 1 else all(e.completed for e in entries))
            ))
        return self._completed

    @property
    def first_entry(self) -> Entry:
        return self.calls[min(self.calls)][0]


@dataclass(slots=True)
class P2PMatch:
    group_id: int
    src: int  # global ranks
    dst: int
    ordinal: int  # position on the (src, dst) channel within the compared window
    # Where the send and the recv are: a row of the sending (receiving) rank's table;
    # no table when that end never posted it. Read them as `send` and `recv`: a job holds
    # hundreds of thousands of pairs, and few are ever read.
    send_table: Optional[EntryTable] = None
    send_row: int = -1
    recv_table: Optional[EntryTable] = None
    recv_row: int = -1
    # Paired among the channel's batched ops (batch_isend_irecv), which pair apart from its
    # plain ones (torch runs those on a communicator of their own): the channel's pairs are
    # its plain ones, then its batched ones (BatchedP2PMatch), each in channel order. A
    # class attribute: a job holds hundreds of thousands of pairs.
    batched: ClassVar[bool] = False

    @property
    def send(self) -> Optional[Entry]:
        return None if self.send_table is None else self.send_table[self.send_row]

    @property
    def recv(self) -> Optional[Entry]:
        return None if self.recv_table is None else self.recv_table[self.recv_row]

    @property
    def paired(self) -> bool:
        return self.send_table is not None and self.recv_table is not None

    @property
    def one_sided(self) -> bool:
        return (self.send_table is None) != (self.recv_table is None)


class BatchedP2PMatch(P2PMatch):
    """A pair of a channel's batched ops."""

    __slots__ = ()
    batched: ClassVar[bool] = True


@dataclass(slots=True)
class MatchResult:
    layout: Layout
    views: tuple[GroupView, ...]  # one per group, in group id order
    collectives: list[CollectiveMatch] = field(default_factory=list)  # sorted by (group, seq)
    p2p: list[P2PMatch] = field(default_factory=list)  # sorted by (group, src, dst, ordinal)
    # Indexes over the lists above, built once on first use (see `index`).
    _index: Optional["MatchIndex"] = None

    @property
    def index(self) -> "MatchIndex":
        """The (group, seq) and per-group indexes every consumer reads through."""
        if self._index is None:
            self._index = MatchIndex.of(self)
        return self._index


class CollectiveLookup:
    """(group id, seq) -> its CollectiveMatch, found by bisection in the group's matches
    (sorted by seq): a dict keyed by the pairs took some 100 bytes per collective."""

    __slots__ = ("_of",)

    def __init__(self, collectives_of: dict[int, list[CollectiveMatch]]) -> None:
        self._of = collectives_of

    def get(self, key: tuple[int, int], default: Optional[CollectiveMatch] = None) -> Optional[CollectiveMatch]:
        group_id, seq = key
        matches = self._of.get(group_id)
        if not matches:
            return default
        i = bisect_left(matches, seq, key=_MATCH_SEQ)
        return matches[i] if i < len(matches) and matches[i].seq == seq else default


_MATCH_SEQ = operator.attrgetter("seq")


@dataclass(frozen=True, slots=True)
class MatchIndex:
    at: CollectiveLookup  # (group id, seq) -> its match
    collectives_of: dict[int, list[CollectiveMatch]]  # group id -> its matches, by seq
    p2p_of: dict[int, list[P2PMatch]]  # group id -> its pairs, by channel and order

    @classmethod
    def of(cls, result: "MatchResult") -> "MatchIndex":
        collectives_of: dict[int, list[CollectiveMatch]] = defaultdict(list)
        for collective in result.collectives:
            collectives_of[collective.group_id].append(collective)
        p2p_of: dict[int, list[P2PMatch]] = defaultdict(list)
        for pair in result.p2p:
            p2p_of[pair.group_id].append(pair)
        return cls(CollectiveLookup(dict(collectives_of)), dict(collectives_of), dict(p2p_of))


# --------------------------------------------------------------------------- streams


def _gaps_are_unknown(dump: RankDump) -> bool:
    """A missing entry proves nothing when some entries could not be read."""
    return dump.unreadable_entries > 0


class DealtDumps:
    """The group parts (table/by_group.py) of each dump dealt while loading (`add`, the loader's `on_dump`), for
    `match` to take up: found by the dump itself (its rank, then the very object), so a
    dump changed or replaced since is dealt again."""

    __slots__ = ("_of_rank",)

    def __init__(self) -> None:
        self._of_rank: dict[int, list[tuple[RankDump, GroupParts]]] = defaultdict(list)

    def add(self, dump: RankDump, parts: Optional[GroupParts] = None) -> None:
        """Keep `dump` dealt: `parts` when a loader worker dealt it already."""
        self._of_rank[dump.rank].append((dump, deal_by_group(dump.entries) if parts is None else parts))

    def of(self, dump: RankDump) -> Optional[GroupParts]:
        """The dump's group parts, when it was dealt here; else None."""
        return next((dealt for held, dealt in self._of_rank.get(dump.rank, ()) if held is dump), None)


def _rank_streams(dump: RankDump, layout: Layout, dealt: Optional[GroupParts] = None,
                  only_active: bool = False) -> dict[int, RankStream]:
    """group id -> RankStream for one rank (from its group parts `dealt` when given); `only_active`:
    the job's dumps keep only active entries."""
    if dealt is None:
        dealt = deal_by_group(dump.entries)
    names_of: dict[int, list[str]] = defaultdict(list)  # gid -> the pg names the rank records it under
    for name in dealt:
        gid = layout.group_of(name, dump.rank)
        if gid is not None:
            names_of[gid].append(name)
    uncertain = _gaps_are_unknown(dump)
    clipped = only_active or dump.wrapped
    # In a dump of only active entries the oldest held record is where finished ones stop
    # being left out, not where the ring cut: a batch there is whole (and often the op the
    # rank waits in).
    cut = batch_at_the_cut(dump.entries) if dump.wrapped and not only_active else None
    per_group: dict[int, RankStream] = {}
    for gid, names in names_of.items():
        if len(names) == 1:
            part = dealt[names[0]]
            collectives, p2p, batched = part.by_sequence, part.p2p, part.batched
        else:  # one group under several names: its entries, back in the rank's order
            collectives = SeqMap.joined([dealt[n].by_sequence for n in names])
            p2p = RowList.joined([dealt[n].p2p for n in names])
            batched = frozenset().union(*(dealt[n].batched for n in names))
        if cut is not None and cut[0] in names and collectives.first == cut[1]:
            # Left out of the match, as a number the ring no longer reaches back to:
            # compared as it stands, what is left of it reads as another op or size.
            collectives = collectives.without_first()
        p2p_whole = not clipped
        if only_active and p2p and not uncertain:
            batched, p2p_whole = _batches_held(p2p, batched)
        per_group[gid] = RankStream(dump.rank, collectives, p2p, collectives.first, collectives.last,
                                    clipped, uncertain, batched, only_active=only_active, p2p_whole=p2p_whole)
    return per_group


def _batches_held(p2p: RowList, batched: frozenset[int]) -> tuple[frozenset[int], bool]:
    """In a dump of only active entries: (the numbers of the rank's P2P batches in the
    group, whether it holds every P2P op it posted there). A finished batch's marker is
    left out, but its ops stay (torch records them without events: they never look
    finished), so two ops or more under one number are a batch too (a plain op takes a
    number of its own). It holds every op when each is a batch's and their numbers run
    from the group's first (1) with none missing (no ring buffer overwrote any): its
    channels then pair in order. A plain op that finished is left out, and its channel
    pairs from its newest completed op back, as a wrapped buffer's does.
    A batch of one op whose marker was left out looks like a plain op; where the numbers
    run whole and the rank posts batches, such an op that never left `scheduled` (as a
    batch's ops never do, and a plain op only while queued) is one too."""
    seqs = p2p.field("p2p_seq_id")
    numbers = Counter(seqs)
    batched = batched | frozenset(number for number, times in numbers.items() if times > 1)
    run_whole = all(type(number) is int for number in numbers) and sorted(numbers) == list(range(1, len(numbers) + 1))
    if run_whole and batched and not batched.issuperset(numbers):
        batched |= frozenset(number for number, state in zip(seqs, p2p.field("state"))
                             if number not in batched and state == "scheduled")
    return batched, run_whole and batched.issuperset(numbers)


def build_views(dumps: Sequence[RankDump], layout: Layout, dealt: Optional[DealtDumps] = None,
                only_active: Optional[bool] = None, own_ids: Optional[dict[int, dict[int, int]]] = None,
                held: Optional[dict[int, set[int]]] = None, p2p_groups: frozenset[int] = frozenset()) -> tuple[GroupView, ...]:
    """GroupView per group; `dealt` holds the dumps dealt already. For dumps trimmed from
    fuller ones (the device view), `own_ids` (rank -> {group id: pg_id}), `held` (rank ->
    the groups it held collectives of) and `p2p_groups` (the groups that run sends and
    recvs) as the fuller dumps show them."""
    dealt = dealt or DealtDumps()
    # The job's dumps keep only active entries (a job-wide setting): then no rank's dump,
    # not even an empty one, shows what it never issued; only its pg_status may.
    if only_active is None:
        only_active = only_active_job(dumps)
    streams_by_group: dict[int, dict[int, RankStream]] = defaultdict(dict)
    dumps_by_rank = {d.rank: d for d in dumps}
    # A rank dumped without its collectives (includeCollectives=False) tells no more about
    # them than a rank that left no dump, and is weighed the same way.
    dumped = {d.rank for d in dumps if d.has_entries}
    for dump in dumps:
        for gid, stream in _rank_streams(dump, layout, dealt.of(dump), only_active).items():
            # Holding no collective of the group in a dump of only active entries says
            # something (see RankStream.absence); having left out ops it queued does not.
            stream.left_queued = held is not None and gid in held.get(dump.rank, ())
            streams_by_group[gid][dump.rank] = stream
    if own_ids is None:
        own_ids = _own_pg_ids(streams_by_group, dumps_by_rank, layout)
    views: list[GroupView] = []
    for group in layout.groups:
        streams = streams_by_group.get(group.id, {})
        for rank in group.ranks:
            if rank in dumped and rank not in streams:
                # A member with a dump but no entries of this group: nothing fell off
                # unless its buffer wrapped.
                dump = dumps_by_rank[rank]
                streams[rank] = RankStream(rank, SeqMap(dump.entries, []), RowList(dump.entries, []), None, None,
                                           only_active or dump.wrapped, _gaps_are_unknown(dump), only_active=only_active,
                                           left_queued=held is not None and group.id in held.get(rank, ()))
        no_dump = tuple(r for r in group.ranks if r not in dumped)
        _read_pg_status(streams, group, dumps_by_rank, own_ids, group.id in p2p_groups)
        views.append(GroupView(group, dict(sorted(streams.items())), no_dump))
    return tuple(views)


def _own_pg_ids(streams_by_group: dict[int, dict[int, RankStream]], dumps: dict[int, RankDump], layout: Layout) -> dict[int, dict[int, int]]:
    """rank -> {group id: the rank's own pg_id for it}. A pg_id is rank-local (groups may
    be created in another order on each rank), so it is read off the rank's own entries of
    the group; for a group it holds no entry of, only by elimination: when a single one of
    its pg_status keys is not the id of a group it holds entries of, and a single one of
    its groups that may have a row holds none (`_may_have_rows`), that key is that
    group's. The default group is the first group every rank creates
    (init_process_group), so its id is 0 unless an entry says 0 is another group's.
    Then, where the job's groups are named by torch's count of groups made, from like
    ranks that made the same groups (`_take_like_ranks_ids`); from ranks whose pg_status has the
    same keys, where their ids agree (`_take_alike_ranks_ids`); and by the order of
    making (`_created_between`, when `_named_in_creation_order`).
    Else the group has no id on the rank, and its pg_status row for the group cannot be
    found (it says nothing)."""
    own: dict[int, dict[int, int]] = defaultdict(dict)
    for gid, streams in streams_by_group.items():
        for rank, stream in streams.items():
            pg_id = _first_pg_id(stream)
            if pg_id is not None:
                own[rank][gid] = pg_id
    groups_of: dict[int, list[int]] = defaultdict(list)
    for group in layout.groups:
        for rank in group.ranks:
            groups_of[rank].append(group.id)
    defaults = {g.id for g in layout.groups if is_default_group(g.name, g.desc)}
    names = {g.id: g.name for g in layout.groups}
    groups = {g.id: g for g in layout.groups}
    seen_running: Optional[set[Family]] = None  # read once a rank has fewer keys than groups left (seldom)
    for rank, dump in dumps.items():
        ids = own[rank]
        default = [gid for gid in groups_of.get(rank, ()) if gid in defaults and gid not in ids]
        if len(default) == 1 and DEFAULT_PG_ID in dump.pg_status and DEFAULT_PG_ID not in ids.values():
            ids[default[0]] = DEFAULT_PG_ID
        unknown_keys = set(dump.pg_status) - set(ids.values())
        # A default group without the default id in pg_status has no row there at all.
        unknown_groups = [gid for gid in groups_of.get(rank, ()) if gid not in ids and gid not in default]
        if len(unknown_keys) < len(unknown_groups):
            if seen_running is None:
                seen_running = {family_of(groups[gid]) for gid, streams in streams_by_group.items()
                                if streams and gid in groups}
            unknown_groups = _may_have_rows([groups[gid] for gid in unknown_groups], seen_running)
        if len(unknown_keys) == 1 and len(unknown_groups) == 1:
            ids[unknown_groups[0]] = unknown_keys.pop()
    # Full dumps leave no key unplaced as a rule: like ranks and the order are then never looked at.
    if not any(_unplaced_keys(own, dumps).values()):
        return own
    in_creation_order = _named_in_creation_order(own, groups_of, names)
    _take_like_ranks_ids(own, groups_of, {g.id: family_of(g) for g in layout.groups}, names, dumps)
    _take_alike_ranks_ids(own, groups_of, dumps)
    unplaced = _unplaced_keys(own, dumps)
    if any(unplaced.values()) and in_creation_order:
        for rank, keys in unplaced.items():
            for key in keys:
                made = _created_between(key, own[rank], groups_of.get(rank, ()), names, keys)
                if made is not None:
                    own[rank][made] = key
    return own


def _may_have_rows(unplaced: list[Group], seen_running: set[Family]) -> list[int]:
    """The ids of those of a rank's `unplaced` groups (more than it has pg_status keys
    left) that may be the ones with a row. A group's row is made by its first op, so some
    of them never ran one on the rank: its groups of one rank, which Megatron runs nothing
    on, are left out where that leaves groups of a family some dump shows running
    (`seen_running`); else none is (all of them stay)."""
    wider = [group for group in unplaced if group.size > 1]
    if wider and len(wider) < len(unplaced) and all(family_of(group) in seen_running for group in wider):
        return [group.id for group in wider]
    return [group.id for group in unplaced]


def _unplaced_keys(own: Mapping[int, Mapping[int, int]], dumps: Mapping[int, RankDump]) -> dict[int, list[int]]:
    """rank -> its pg_status keys no group of it is placed on yet, in order."""
    return {rank: sorted(set(dump.pg_status) - set(own.get(rank, {}).values())) for rank, dump in dumps.items()}


# Ranks that made the same groups: their families in the order of the groups' names, and
# their pg_status rows' keys.
_LikeRanks = tuple[tuple[Family, ...], frozenset[int]]


def _take_like_ranks_ids(own: dict[int, dict[int, int]], groups_of: Mapping[int, Sequence[int]],
                         families: Mapping[int, Family], names: Mapping[int, str], dumps: Mapping[int, RankDump]) -> None:
    """Give a rank the ids its like ranks tell for the groups it tells none of. Where the
    job's groups are named by torch's count of groups made, ranks whose groups, in the
    order of their names, are of the same families (the same description and size), and
    whose pg_status rows have the same keys, made the same groups in the same order, the
    groups the dumps do not name (which take ids too) included: each took the same pg_id
    for its group at each place. (Ranks of one family sequence may still make unnamed
    groups of their own: in the real NVRx dumps the two pipeline stages do, and their rows'
    keys differ.) Like ranks whose told ids do not grow with their places, or that tell
    two ids for one place or one id for two, made their groups otherwise: no rank of
    theirs takes any. An id is taken only where the rank's row under it is not placed on
    another of its groups yet."""
    classes: dict[_LikeRanks, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    made: dict[int, tuple[_LikeRanks, list[int]]] = {}
    for rank, dump in dumps.items():
        numbers = _creation_numbers(groups_of.get(rank, ()), names)
        if numbers is None:
            continue
        order = sorted(numbers, key=numbers.__getitem__)
        like = (tuple(families[gid] for gid in order), frozenset(dump.pg_status))
        made[rank] = (like, order)
        for place, gid in enumerate(order):
            if gid in own[rank]:
                classes[like][place].add(own[rank][gid])
    agreed = {like: ids for like, told in classes.items() if (ids := _agreed_ids(told)) is not None}
    for rank, (like, order) in made.items():
        told_here, ids = agreed.get(like, {}), own[rank]
        free = set(dumps[rank].pg_status) - set(ids.values())
        for place, gid in enumerate(order):
            pg_id = told_here.get(place)
            if gid not in ids and pg_id in free:
                ids[gid] = pg_id
                free.discard(pg_id)


def _take_alike_ranks_ids(own: dict[int, dict[int, int]], groups_of: Mapping[int, Sequence[int]],
                       dumps: Mapping[int, RankDump]) -> None:
    """Give a rank, for a group it tells no id of, the id another rank tells for it where
    both made their groups alike: a pg_id counts the groups the rank made before it, so
    ranks whose pg_status rows have the same keys (the ids of their groups that ran an
    op) made theirs in one order, and a group they share has one id on both. Read so only
    where those ranks' told ids show it: no group is told two ids among them (ranks that
    made groups in orders of their own tell some so). An id is taken only where it is a
    key of the rank's pg_status that no group of it is placed on yet."""
    alike: dict[frozenset[int], list[int]] = defaultdict(list)
    for rank, dump in dumps.items():
        alike[frozenset(dump.pg_status)].append(rank)
    unplaced = _unplaced_keys(own, dumps)
    for ranks in alike.values():
        if len(ranks) < 2 or not any(unplaced.get(rank) for rank in ranks):
            continue
        told: dict[int, set[int]] = defaultdict(set)
        for rank in ranks:
            for gid, pg_id in own[rank].items():
                told[gid].add(pg_id)
        if any(len(ids) > 1 for ids in told.values()):
            continue
        shared = {gid: next(iter(ids)) for gid, ids in told.items()}
        for rank in ranks:
            free, ids = set(unplaced.get(rank, ())), own[rank]
            for gid in groups_of.get(rank, ()):
                told_id = shared.get(gid)
                if gid not in ids and told_id is not None and told_id in free:
                    ids[gid] = told_id
                    free.discard(told_id)


def _agreed_ids(told: Mapping[int, set[int]]) -> Optional[dict[int, int]]:
    """place -> id, from like ranks' ids by the place of their group, where they tell one
    id a place, growing with the places (as groups made in one order take them, so no id
    at two places either); else None."""
    if any(len(ids) > 1 for ids in told.values()):
        return None
    by_place = {place: next(iter(ids)) for place, ids in sorted(told.items()) if ids}
    in_order = list(by_place.values())
    return by_place if all(a < b for a, b in zip(in_order, in_order[1:])) else None


def _creation_numbers(group_ids: Sequence[int], names: Mapping[int, str]) -> Optional[dict[int, int]]:
    """group id -> the number torch named it by (`str` of its count of groups made so far,
    the same on every rank), or None when a name is not such a number (hashed names)."""
    if not all(names[gid].isdecimal() and names[gid].isascii() for gid in group_ids):
        return None
    return {gid: int(names[gid]) for gid in group_ids}


def _named_in_creation_order(own: Mapping[int, Mapping[int, int]], groups_of: Mapping[int, Sequence[int]],
                             names: Mapping[int, str]) -> bool:
    """Whether the job's ranks made their groups in the order their numbered names count,
    as torch does by default (it names a group by the count of groups made before it; a
    rank numbers the groups it joins 0, 1, 2... as it makes them, so each group it joins
    takes an id at least its place among them). Where their entries tell them, every
    rank's own ids must grow with its groups' names and none may come before its place;
    and some rank must tell two ids besides the default one, or nothing shows the order.
    Ranks that each tell one (dumps of only active entries, one op a rank) show it when
    every such id is exactly its group's place, for two groups or more: a group made out
    of its name's order puts some rank's id off its place. A job whose ranks made their
    groups in orders of their own (or whose names are hashed) shows it on some rank, and
    no id is read from the order anywhere."""
    shown = False
    at_place: set[int] = set()
    off_place = False
    for rank, ids in own.items():
        numbers = _creation_numbers(groups_of.get(rank, ()), names)
        if numbers is None or not set(ids) <= set(numbers):
            return False
        place = {gid: at for at, gid in enumerate(sorted(numbers, key=numbers.__getitem__))}
        by_name = sorted(ids, key=place.__getitem__)
        if any(ids[a] >= ids[b] for a, b in zip(by_name, by_name[1:])) or any(ids[g] < place[g] for g in ids):
            return False
        told = [gid for gid, pg_id in ids.items() if pg_id != DEFAULT_PG_ID]
        shown = shown or len(told) >= 2
        if len(told) == 1 and ids[told[0]] == place[told[0]]:
            at_place.add(told[0])
        elif len(told) == 1:
            off_place = True
    return shown or (len(at_place) >= 2 and not off_place)


def _created_between(key: int, ids: Mapping[int, int], groups: Sequence[int], names: Mapping[int, str],
                     unplaced: Sequence[int] = ()) -> Optional[int]:
    """The group of the rank without an id that pg_id `key` is the id of, by the order of
    making: it lies after the group with the next lower id the rank tells, and before the
    one with the next higher. One such group is it. Several are it in turn when they use
    up every id between those two (none was made between them that the dumps do not name:
    a group that never ran an op has no pg_status row but takes an id); or, past the
    highest id the rank tells, when the rank's pg_status keys not placed yet (`unplaced`)
    run on from it, one for each such group and none missing (see `_made_last`). Else None."""
    numbers = _creation_numbers(groups, names)
    if numbers is None:
        return None
    lower = max(((pg_id, gid) for gid, pg_id in ids.items() if pg_id < key), default=None)
    higher = min(((pg_id, gid) for gid, pg_id in ids.items() if pg_id > key), default=None)
    after = numbers[lower[1]] if lower is not None else -1
    candidates = sorted((gid for gid in groups if gid not in ids and numbers[gid] > after
                         and (higher is None or numbers[gid] < numbers[higher[1]])), key=numbers.__getitem__)
    if len(candidates) == 1:
        return candidates[0]
    if lower is not None and higher is not None and higher[0] - lower[0] - 1 == len(candidates):
        return candidates[key - lower[0] - 1]
    if lower is not None and higher is None and _made_last(lower[0], len(candidates), unplaced, ids):
        return candidates[key - lower[0] - 1]
    return None


def _made_last(lowest: int, count: int, unplaced: Sequence[int], ids: Mapping[int, int]) -> bool:
    """Whether the rank's pg_status keys above pg_id `lowest` that no group holds yet are
    exactly the `count` ids after it: then the `count` groups it made after that one,
    each of which ran an op, took them in turn. A gap (a group that never ran an op has
    no row) or a key too many leaves the order open."""
    taken = set(ids.values())
    above = sorted(k for k in unplaced if k > lowest and k not in taken)
    return count > 0 and above == list(range(lowest + 1, lowest + 1 + count))


def _read_pg_status(streams: dict[int, RankStream], group: Group, dumps: dict[int, RankDump],
                    own_ids: dict[int, dict[int, int]], runs_p2p: bool = False) -> None:
    """Set each member's `enqueued` and `finished` from its pg_status, keyed by the rank's
    own pg_id (`_own_pg_ids`; never the id its peers use: on it, that may be another
    group). It holds the sequence number of the group's last work, which is a P2P number
    when that work was a send or recv: so it is read only for groups with no P2P op, or
    for ranks whose newest entry of the group is a collective."""
    has_p2p = runs_p2p or any(stream.p2p for stream in streams.values())
    statuses: dict[int, PgStatus] = {}
    for rank in group.ranks:
        member, dump = streams.get(rank), dumps.get(rank)
        pg_id = own_ids.get(rank, {}).get(group.id)
        if member is not None:
            member.pg_id = pg_id
        if member is not None and dump is not None and dump.pg_status and pg_id is not None:
            status = dump.pg_status.get(pg_id)
            if status is not None:
                statuses[rank] = status
    # A member whose pg_status mixes numberings shows the group runs P2P work too, even when
    # no dump holds a P2P op of it any more (dumps of only active entries leave them out).
    has_p2p = has_p2p or any(mixes_numberings(status) for status in statuses.values())
    unplaced = [rank for rank, member in streams.items() if member.pg_id is None and rank in group.ranks]
    if unplaced and not has_p2p:
        newest = _newest_number(streams.values(), statuses.values())
        for rank in unplaced:
            dump = dumps.get(rank)
            if dump is not None and newest is not None:
                streams[rank].finished_unplaced = _finished_unplaced(dump, own_ids.get(rank, {}), newest)
    for rank, status in statuses.items():
        member = streams[rank]
        if not _counts_collectives(member, status, has_p2p):
            continue
        member.enqueued = status.last_enqueued  # -1: it enqueued none
        member.finished = status.last_completed if status.last_completed is not None and status.last_completed >= 0 else None


def _counts_collectives(stream: RankStream, status: PgStatus, has_p2p: bool) -> bool:
    """Whether the member's pg_status row for a group counts its collectives: in a group
    that runs P2P work too, only after a collective (`_newest_is_collective`), and not
    where its finished number is a P2P one (`_finished_past_unfinished`); never where its
    numbers are of both kinds (`mixes_numberings`)."""
    if has_p2p and (not _newest_is_collective(stream) or _finished_past_unfinished(stream, status)):
        return False
    return not mixes_numberings(status)


def _finished_past_unfinished(stream: RankStream, status: PgStatus) -> bool:
    """pg_status says the rank finished up to the newest collective its dump holds of the
    group, which the dump shows unfinished. A communicator finishes its work in order, and
    an entry is marked finished no later than its row: the finished number is a send's or
    recv's, of the other numbering (the two meet), and cannot be read against entries."""
    newest = stream.collectives.last
    return (newest is not None and status.last_completed is not None and status.last_completed >= newest
            and not stream.collectives.completed_at(newest))


def _newest_number(streams: Iterable[RankStream], statuses: Iterable[PgStatus]) -> Optional[int]:
    """The newest collective number of a group that any member holds or its pg_status says
    it enqueued."""
    held = [stream.last_seq for stream in streams if stream.last_seq is not None]
    enqueued = [status.last_enqueued for status in statuses if status.last_enqueued is not None]
    return max(held + enqueued, default=None)


def _finished_unplaced(dump: RankDump, placed: Mapping[int, int], newest: int) -> Optional[int]:
    """The most the rank finished by any pg_status row of its dump that may be the row of
    a group whose newest number is `newest`: a row no other of its groups is placed on
    (`placed`: group id -> pg_id) that enqueued no more than that (a row past it is
    another group's, one with more collectives); None when no row may be."""
    taken = set(placed.values())
    done = [status.last_completed for pg_id, status in dump.pg_status.items()
            if pg_id not in taken and status.last_completed is not None
            and status.last_enqueued is not None and status.last_enqueued <= newest]
    return max(done, default=None)


def _first_pg_id(stream: RankStream) -> Optional[int]:
    """pg_id of the stream's first entry: its oldest collective's, else its first P2P
    op's; None when it holds none. Read off the columns, without building an Entry."""
    if stream.collectives:
        pg_id: Optional[int] = stream.collectives.oldest_value("pg_id")
        return pg_id
    return stream.p2p.value_at(0, "pg_id") if stream.p2p else None


def _newest_is_collective(stream: RankStream) -> bool:
    """Whether the stream's newest entry (by position in the rank's dump) is a collective."""
    if not stream.collectives:
        return False
    return not stream.p2p or stream.collectives.newest_value("index") > stream.p2p.value_at(-1, "index")


# --------------------------------------------------------------------------- signatures


# What every member must agree on for one op: (op, input elements, output elements,
# dtypes), an element count None where it may differ (see _op_signature).
# (op, input elements, output elements, dtypes); a part that could not be read is UNKNOWN
OpSignature = tuple[str, Union[int, str, None], Union[int, str, None], Union[frozenset[str], str]]
# A batch's: one per op, None when an op cannot be read.
Signature = Optional[tuple[OpSignature, ...]]
# batch_signature's cache: the ids of a batch's op names and shapes -> its signature, and
# each signature -> the one object kept for it (see _cached_signature).
SignatureCache = dict[tuple[object, ...], Signature]
# One entry's key, or a batch's (NOT_SINGLE left out).
OpOrBatchKey = Union[OpKey, BatchKey]


# A part of a signature that could not be read (see Shapes.unread): equal to anything.
UNKNOWN = "?"


def _op_signature(name: OpName, shapes: Shapes) -> Optional[OpSignature]:
    """What every member must agree on for one op (its `name` and `shapes`), given what
    may legitimately differ; None when the op could not be read. A size or dtype list that
    could not be read is UNKNOWN: the op and the rest are still compared."""
    op = name.op
    # Equality, not identity: entries loaded by worker processes arrive as copies.
    if name == UNREADABLE_OP:
        return None
    unread = () if shapes.readable else (shapes.unread or SHAPE_FIELDS)
    in_numel: Union[int, str, None]
    out_numel: Union[int, str, None]
    if op in RANK_DEPENDENT_SIZE_OPS:
        in_numel = out_numel = None
    else:
        # Element counts, not shapes: list-form and stacked all_gather outputs are both valid.
        in_numel = None if op in ROOT_ONLY_INPUT_OPS else numel(shapes.input_sizes)
        out_numel = None if op in ROOT_ONLY_OUTPUT_OPS else numel(shapes.output_sizes)
        if unread:
            in_numel = UNKNOWN if in_numel is not None and "input_sizes" in unread else in_numel
            out_numel = UNKNOWN if out_numel is not None and "output_sizes" in unread else out_numel
    dtypes: Union[frozenset[str], str] = frozenset(shapes.input_dtypes) | frozenset(shapes.output_dtypes)
    if "input_dtypes" in unread or "output_dtypes" in unread:
        dtypes = UNKNOWN
    return op, in_numel, out_numel, dtypes


def is_partial(signature: tuple[OpSignature, ...]) -> bool:
    """Whether a batch signature holds a part that could not be read (UNKNOWN)."""
    return any(UNKNOWN in op for op in signature)


def _compatible(a: tuple[OpSignature, ...], b: tuple[OpSignature, ...]) -> bool:
    """Whether two batch signatures agree wherever both are known."""
    return len(a) == len(b) and all(
        x == y or x == UNKNOWN or y == UNKNOWN for op_a, op_b in zip(a, b) for x, y in zip(op_a, op_b))


def batch_signature(entries: Sequence[Entry], cache: Optional[SignatureCache] = None) -> Signature:
    """Signatures of a batch's ops, None when one of them cannot be read.

    With a `cache` (one per `match` call), equal signatures come back as one shared
    object, so comparing the members of a healthy collective costs identity checks. It
    is keyed by the ids of the interned op name and shapes most entries of a rank share.
    """
    ops: list[tuple[OpName, Shapes]] = list(map(_NAME_SHAPES, entries))
    return _signature(ops) if cache is None else _cached_signature(ops, cache)


def _key_signature(key: OpOrBatchKey, cache: SignatureCache) -> Signature:
    """batch_signature of the entries a key of SeqMap.keys_at (one entry's or a
    `BatchKey`) stands for, from the key alone, through the same `cache`."""
    if isinstance(key, BatchKey):
        return _cached_signature([(op.name, op.shapes) for op in key], cache)
    # One op, looked up first as _cached_signature would: thousands of ranks' all_to_alls.
    ids = (id(key.name), id(key.shapes))
    return cache[ids] if ids in cache else _cached_signature([(key.name, key.shapes)], cache)


def _signature(ops: Sequence[tuple[OpName, Shapes]]) -> Signature:
    """Signatures of a batch's ops, given as (name, shapes) each; a batch's marker is no op."""
    signature = tuple(_op_signature(name, shapes) for name, shapes in ops if not name.is_coalesced_marker)
    return None if None in signature else signature  # type: ignore[return-value]  # no None left


def _cached_signature(ops: Sequence[tuple[OpName, Shapes]], cache: SignatureCache) -> Signature:
    """`_signature(ops)`, looked up in `cache` by the ids of the ops' names and shapes."""
    key = tuple([id(part) for op in ops for part in op])
    if key not in cache:
        cache[key] = _shared(cache, _signature(ops))
    return cache[key]


def _shared(cache: SignatureCache, signature: Signature) -> Signature:
    # Signatures are tuples of tuples and the other keys tuples of ints: they cannot collide.
    return signature if signature is None else cache.setdefault(signature, signature)


def _difference_kind(a: tuple[OpSignature, ...], b: tuple[OpSignature, ...]) -> str:
    if len(a) != len(b) or any(x[0] != y[0] for x, y in zip(a, b)):
        return "op_mismatch"
    if any(x[3] and y[3] and UNKNOWN not in (x[3], y[3]) and x[3] != y[3] for x, y in zip(a, b)):
        return "dtype_mismatch"
    return "size_mismatch"


def _kinds_of_key(key: OpOrBatchKey) -> tuple[tuple[OpName, Shapes], ...]:
    """What a rank issued, as (name, shapes) of each of its ops (a coalesced batch as
    much as one op), from its key (see SeqMap.keys_at): two ranks issued the same ops
    when these are equal."""
    if isinstance(key, BatchKey):
        return tuple((op.name, op.shapes) for op in key)
    return ((key.name, key.shapes),)


def find_disagreement(calls: Mapping[int, Sequence[Entry]], cache: Optional[SignatureCache] = None,
                      alike: bool = False) -> Optional[Disagreement]:
    """Consensus over the members that issued the op: the odd ones out, or a tie. `alike`
    says every rank issued the same ops (names and shapes, in order): no disagreement."""
    if alike:
        return None
    return _disagreement([(rank, batch_signature(entries, cache)) for rank, entries in calls.items()])


def _disagreement(signatures: list[tuple[int, Signature]]) -> Optional[Disagreement]:
    """find_disagreement over each rank's signature: (rank, batch_signature) pairs."""
    first = signatures[0][1] if signatures else None
    if all(signature is first for _, signature in signatures):
        return None  # the common case: everyone issued the same thing
    by_signature: dict[tuple[OpSignature, ...], list[int]] = defaultdict(list)
    partial: list[tuple[int, tuple[OpSignature, ...]]] = []
    for rank, signature in signatures:
        if signature is None:  # an unreadable op neither votes nor is blamed
            continue
        if is_partial(signature):
            partial.append((rank, signature))
        else:
            by_signature[signature].append(rank)
    if partial:
        _place_partial(by_signature, partial)
    if len(by_signature) < 2:
        return None
    classes = sorted(((tuple(sorted(r)), sig) for sig, r in by_signature.items()), key=lambda c: (-len(c[0]), c[0]))
    tie = len(classes[0][0]) == len(classes[1][0])
    majority_ranks, majority_sig = classes[0]
    odd = tuple(sorted(r for ranks, _ in classes[1:] for r in ranks))
    kinds = Counter(_difference_kind(majority_sig, sig) for _, sig in classes[1:])
    # Report the most fundamental difference: op beats dtype beats size.
    kind = next(k for k in ("op_mismatch", "dtype_mismatch", "size_mismatch") if k in kinds)
    if tie:
        return Disagreement(kind, (), tuple(sorted(majority_ranks + odd)), tuple(classes), True)
    return Disagreement(kind, majority_ranks, odd, tuple(classes), False)


def _place_partial(by_signature: dict[tuple[OpSignature, ...], list[int]],
                   partial: list[tuple[int, tuple[OpSignature, ...]]]) -> None:
    """Add to `by_signature` (fully read signature -> ranks) the ranks whose signature is
    partly unknown, as far as what is known tells: one that agrees with a fully read
    class where both are known neither votes nor is blamed (unknown is no evidence
    either way); one that agrees with none forms a class of its own (with those it
    agrees with), since what is known already differs: an op name, a count."""
    complete = list(by_signature)
    own: list[tuple[OpSignature, ...]] = []  # signatures of the classes formed here
    for rank, signature in partial:
        if any(_compatible(signature, other) for other in complete):
            continue
        home = next((other for other in own if _compatible(signature, other)), None)
        if home is None:
            own.append(signature)
            home = signature
        by_signature[home].append(rank)


# --------------------------------------------------------------------------- matching


# A collective `_unsettled` picked out, judged: (its position among the group's numbers,
# the ranks that issued it, those that completed it, how they disagree or None).
Judged = tuple[int, tuple[int, ...], tuple[int, ...], Optional["Disagreement"]]


class CollectivePlan(NamedTuple):
    """What matching a group's collectives found, before a match is built: the numbers
    any member holds, sorted, and the collectives not settled at a glance, judged."""

    seqs: list[int]
    judged: list[Judged]


class P2PPlan(NamedTuple):
    """What pairing a group's P2P ops found, as rows of the recording ranks' tables: per
    channel (src, dst, the send rows, the recv rows, None where that end never posted
    the op; how many of the pairs, the first, are of plain ops, the rest batched ones),
    then per destination the rows of its `recv ?` that took no send."""

    channels: list[tuple[int, int, list[Optional[int]], list[Optional[int]], int]]
    leftovers: list[tuple[int, list[int]]]


class GroupPlan(NamedTuple):
    """A group's match before its matches are built: ints and a few disagreements, which
    a forked child sends back in a fraction of the time the matches would take."""

    collectives: CollectivePlan
    p2p: P2PPlan


def _plan_collectives(view: GroupView, signature_cache: SignatureCache, op_keys: OpKeys) -> CollectivePlan:
    streams = view.streams
    if not streams:
        return CollectivePlan([], [])
    ranks = tuple(streams)  # sorted
    tables = [stream.collectives for stream in streams.values()]
    seqs = sorted(set().union(*tables))  # the numbers any rank holds
    keys = [table.keys_at(seqs, op_keys) for table in tables]
    judged: list[Judged] = []
    for position in sorted(_unsettled(keys)):
        issuers, completed, disagreement = _judge(streams, ranks, seqs[position], [k[position] for k in keys],
                                                  signature_cache)
        judged.append((position, issuers, completed, disagreement))
    return CollectivePlan(seqs, judged)


def _built_collectives(view: GroupView, plan: CollectivePlan) -> list[CollectiveMatch]:
    streams = view.streams
    if not streams:
        return []
    ranks = tuple(streams)  # sorted
    members = [r for r in view.group.ranks if r in streams]
    seqs = plan.seqs
    matches: list[CollectiveMatch] = []
    done = 0  # positions of seqs before it have their match
    for position, issuers, completed, disagreement in plan.judged:
        matches += _settled_matches(view, ranks, seqs[done:position])
        matches.append(_judged_match(view, ranks, members, seqs[position], issuers, completed, disagreement))
        done = position + 1
    matches += _settled_matches(view, ranks, seqs[done:])
    return matches


def _settled_matches(view: GroupView, ranks: tuple[int, ...], seqs: Sequence[int]) -> list[CollectiveMatch]:
    """The matches of collectives `_unsettled` found settled: each of `ranks` (every rank
    of the view) issued the same op or batch and completed it, so no member is absent
    and all but the number is the same for each."""
    group_id, streams, no_dump = view.group.id, view.streams, view.no_dump
    return [CollectiveMatch(group_id, seq, LazyCalls(streams, seq), (), (), no_dump, False, None, ranks)
            for seq in seqs]


def _judged_match(view: GroupView, ranks: tuple[int, ...], members: list[int], seq: int, issuers: tuple[int, ...],
                  completed: tuple[int, ...], disagreement: Optional[Disagreement]) -> CollectiveMatch:
    """The match of collective `seq`, which `issuers` of `ranks` (every rank of the view)
    issued and `completed` completed; why each member that holds no entry of it has none."""
    streams = view.streams
    # Judged from the keys: the entries are read when someone asks.
    calls = LazyCalls(streams, seq, None if len(issuers) == len(ranks) else issuers)
    absence: dict[str, tuple[int, ...]] = {}
    strays = len(ranks) > len(members)  # ranks with entries of the group but not in it
    if strays or len(issuers) < len(members):
        held = set(issuers)
        absent = [rank for rank in members if rank not in held]
        why = [streams[r].absence(seq) for r in absent]
        absence = {kind: tuple(r for r, w in zip(absent, why) if w == kind) for kind in set(why)}
    return CollectiveMatch(view.group.id, seq, calls, absence.get("not_issued", ()), absence.get("unknown", ()),
                           view.no_dump, len(completed) < len(issuers), disagreement, completed,
                           absence.get("finished", ()))


def _judge(streams: dict[int, RankStream], ranks: tuple[int, ...], seq: int, row: list[NumberKey],
           cache: SignatureCache) -> tuple[tuple[int, ...], tuple[int, ...], Optional[Disagreement]]:
    """(ranks that issued it, ranks that completed it, Disagreement or None) of the
    collective `seq`, one `_unsettled` found, from the key each of `ranks` (the ranks of
    `streams`) holds at it (`row`, see SeqMap.keys_at): the keys hold the op names,
    shapes and states. Only a rank whose key does not say completed has its entries'
    other fields read (see `SeqMap.completed_at`), and no Entry is built: most such
    collectives are alike, and differ by state (a hang) or by sizes an op may differ in
    (all_to_all); find_disagreement's result comes from signatures of the keys."""
    # Read in C, per rank, wherever a rank's key decides: a row holds thousands of ranks.
    holds = list(map(operator.is_not, row, repeat(NOT_SINGLE)))
    issuers = tuple(compress(ranks, holds))
    keys: list[OpOrBatchKey] = list(compress(row, holds))  # type: ignore[arg-type]  # NOT_SINGLE left out
    key_ids = list(map(id, keys))
    # Ranks that issued the same op and say the same state share one key (see OpKeys):
    # each distinct key is looked at once, a thousand ranks waiting in a hang at one go.
    distinct = dict(zip(key_ids, keys))
    says_completed = {key_id: _says_completed(key) for key_id, key in distinct.items()}
    said = list(map(says_completed.__getitem__, key_ids))
    if all(said):
        completed = issuers
    else:  # only these ranks have their entries' other fields read
        completed = tuple(rank for rank, done in zip(issuers, said) if done or streams[rank].collectives.completed_at(seq))
    kinds = [_kinds_of_key(key) for key in distinct.values()]
    if all(map(operator.eq, kinds, repeat(kinds[0]))):
        return issuers, completed, None
    signature_of = {key_id: _key_signature(key, cache) for key_id, key in distinct.items()}
    return issuers, completed, _disagreement(list(zip(issuers, map(signature_of.__getitem__, key_ids))))


def _says_completed(key: OpOrBatchKey) -> bool:
    """Whether the state of every op of a key (see SeqMap.keys_at) is "completed"."""
    if isinstance(key, BatchKey):
        return all(op.state == "completed" for op in key)
    return key.state == "completed"


def _completed_key(key: NumberKey) -> object:
    """What every rank's key must be for the collective to be settled: the first rank's,
    completed (for a batch: every entry of it). That is the key itself as a rule, so the
    other ranks' keys (the same shared object) compare by identity."""
    if key is NOT_SINGLE:
        return _NEVER
    assert isinstance(key, (OpKey, BatchKey))
    if _says_completed(key):
        return key
    if isinstance(key, BatchKey):
        return BatchKey(op._replace(state="completed") for op in key)
    return key._replace(state="completed")


def _unsettled(columns: list[list[NumberKey]]) -> set[int]:
    """Positions of the rows of `columns` (one column of keys per rank, see `SeqMap.keys_at`, one
    row per sequence number) that are not settled: settled is when every rank issued one
    entry (or one coalesced batch), with the same op names and shapes as the others, and
    says each completed. Most
    collectives of a job are settled so, and this finds them a column at a time in C
    rather than rank by rank in Python. Equal values are shared objects (see the
    loader), so comparing them mostly costs an identity check."""
    rows = range(len(columns[0]))
    expected = list(map(_completed_key, columns[0]))
    unsettled: set[int] = set()
    for column in columns:
        if column != expected:
            unsettled.update(compress(rows, map(operator.ne, column, expected)))
    return unsettled


def _every_collective(columns: list[list[NumberKey]]) -> set[int]:
    """_unsettled's plain twin: no collective settled at a glance, each judged on its own."""
    return set(range(len(columns[0])))


def _channel_ends(ranks: tuple[int, ...], rank: int, name: OpName) -> Optional[tuple[Optional[int], Optional[int]]]:
    """Global (src, dst) of a P2P op recorded by `rank` in a group of `ranks`; the
    recording rank is one end."""
    if name.op == "send":
        return rank, _global_rank(ranks, name.local_dst)
    if name.op == "recv":
        return _global_rank(ranks, name.local_src), rank
    return None


def _global_rank(ranks: tuple[int, ...], local: Optional[int]) -> Optional[int]:
    if local is None or local < 0:
        return None
    return ranks[local] if local < len(ranks) else None


# A P2P op is read as a row of the table of the rank that recorded it: a channel's sends
# are rows of its source's table, its receives rows of its destination's. Pairs are
# (send row, recv row), None where that end never posted the op.
Pair = tuple[Optional[int], Optional[int]]
# A channel's pairs as two columns of equal length: the send rows and the recv rows.
PairColumns = tuple[list[Optional[int]], list[Optional[int]]]


def _pair_channel(sends: list[int], recvs: list[int], sender_pending: set[int], receiver_pending: set[int]) -> list[Pair]:
    """(send, recv) pairs of one channel, aligned by the ops themselves: clocks of two
    ranks are never compared (a receiver posts its recv before the send is posted). A
    completed op had its partner, so completed ops pair from the newest back (the older
    end of either window may have fallen off its ring buffer); ops still pending pair
    from the oldest on, and what is left on one side was never matched by the other.
    `sender_pending` (`receiver_pending`) holds the rows of the sender's (receiver's)
    ops that did not complete (see `RowList.unfinished_rows`)."""
    done_sends, pending_sends = _split_done(sends, sender_pending)
    done_recvs, pending_recvs = _split_done(recvs, receiver_pending)
    older = len(done_sends) - len(done_recvs)
    pairs: list[Pair] = []
    pairs += [(s, None) for s in done_sends[:max(older, 0)]] + [(None, r) for r in done_recvs[:max(-older, 0)]]
    pairs += zip(done_sends[max(older, 0):], done_recvs[max(-older, 0):])
    pairs += zip(pending_sends, pending_recvs)
    pairs += [(s, None) for s in pending_sends[len(pending_recvs):]] + [(None, r) for r in pending_recvs[len(pending_sends):]]
    return pairs


def _pair_in_order(sends: list[int], recvs: list[int]) -> PairColumns:
    """(send, recv) pairs, as columns, of a channel both of whose ends hold their whole
    history (no ring buffer wrapped): the k-th send goes with the k-th recv. A send that
    completed while its recv still looks pending (the receiver's GPU stopped reporting)
    stays paired with it, as it must: a send cannot finish before its recv is posted."""
    count = max(len(sends), len(recvs))
    padded_sends: list[Optional[int]] = [*sends, *[None] * (count - len(sends))]
    padded_recvs: list[Optional[int]] = [*recvs, *[None] * (count - len(recvs))]
    return padded_sends, padded_recvs


def _split_done(rows: list[int], pending: set[int]) -> tuple[list[int], list[int]]:
    """(rows of completed ops, the rest), each in channel order, given the rows whose op
    did not complete (`pending`)."""
    if not pending:  # as a rule: an op still running is rare
        return rows, []
    return [row for row in rows if row not in pending], [row for row in rows if row in pending]


def _channel_end(table: Optional[EntryTable], rows: list[int], batched: frozenset[int]) -> tuple[list[int], list[int]]:
    """(plain, batched) rows of one end of a channel, each in channel order: by
    (p2p_seq_id, op_id, record_id), read off the columns of `table`, the recording
    rank's. A rank posts its ops in that order as a rule, and strictly rising P2P
    sequence numbers leave nothing to sort. An op is batched when its p2p_seq_id is one
    of the rank's P2P batches' (`batched`)."""
    if table is None or not rows:  # no table: the rank posted nothing
        return [], []
    seqs = table.field_at("p2p_seq_id", rows)
    if not all(map(operator.lt, seqs, seqs[1:])):
        order_keys = list(zip(seqs, table.field_at("op_id", rows), table.field_at("record_id", rows)))
        order = sorted(range(len(rows)), key=order_keys.__getitem__)  # stable, as sorting the ops was
        rows, seqs = [rows[k] for k in order], [seqs[k] for k in order]
    if not batched:
        return rows, []
    is_batched = list(map(batched.__contains__, seqs))
    return list(compress(rows, map(operator.not_, is_batched))), list(compress(rows, is_batched))


def _deal_p2p(view: GroupView) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[int]],
                                        dict[int, list[int]], dict[int, set[int]]]:
    """(sends, recvs, any-source recvs, pending) of a group, as rows of the recording
    rank's table: (src, dst) -> the rows of sends (of src's table) and of recvs (of
    dst's) with both ends known, dst -> the rows of its `recv ?`, and rank -> the rows
    of its ops that did not complete (`RowList.unfinished_rows`). A rank posts along a
    few channels under a few op names: each is placed once (`RowList.deal_by_name`);
    no Entry is built."""
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[int]] = defaultdict(list)
    any_source: dict[int, list[int]] = defaultdict(list)
    pending: dict[int, set[int]] = {}
    ignored: list[int] = []  # ops with no channel: not a send or recv, or an end outside the group
    for rank, stream in view.streams.items():
        if not stream.p2p:
            continue

        def bucket_of(name: OpName, rank: int = rank) -> list[int]:
            ends = _channel_ends(view.group.ranks, rank, name)
            if ends is None:
                return ignored
            src, dst = ends
            if name.op == "send":
                return sends[src, dst] if src is not None and dst is not None else ignored
            if src is not None and dst is not None:  # recv
                return recvs[src, dst]
            return any_source[dst] if dst is not None else ignored
        stream.p2p.deal_by_name(bucket_of)
        pending[rank] = stream.p2p.unfinished_rows()
    return sends, recvs, any_source, pending


def _p2p_table(streams: dict[int, RankStream], rank: int) -> Optional[EntryTable]:
    """The table the rank's P2P ops of the group are rows of; None when it has none."""
    stream = streams.get(rank)
    return stream.p2p.table if stream is not None else None


def _built_p2p(view: GroupView, plan: P2PPlan) -> list[P2PMatch]:
    """A P2PMatch per pair of a group's P2P ops, by channel (src, dst) and order on it,
    then one per `recv ?` that took no send."""
    streams, group_id = view.streams, view.group.id
    matches: list[P2PMatch] = []
    for src, dst, send_rows, recv_rows, plain in plan.channels:
        matches += _channel_matches(group_id, src, dst, _p2p_table(streams, src), _p2p_table(streams, dst),
                                    send_rows, recv_rows, plain)
    for dst, leftovers in plan.leftovers:
        recv_table = _p2p_table(streams, dst)
        matches += [P2PMatch(group_id, -1, dst, ordinal, None, -1, recv_table, row) for ordinal, row in enumerate(leftovers)]
    return matches


def _plan_p2p(view: GroupView) -> P2PPlan:
    sends, recvs, any_source, pending = _deal_p2p(view)
    streams = view.streams
    channels: list[tuple[int, int, list[Optional[int]], list[Optional[int]], int]] = []
    no_batches: frozenset[int] = frozenset()
    none_pending: set[int] = set()
    for src, dst in sorted(set(sends) | set(recvs)):
        send_table, recv_table = _p2p_table(streams, src), _p2p_table(streams, dst)
        plain_sends, batched_sends = _channel_end(
            send_table, sends.get((src, dst), []), streams[src].batched if src in streams else no_batches)
        plain_recvs, batched_recvs = _channel_end(
            recv_table, recvs.get((src, dst), []), streams[dst].batched if dst in streams else no_batches)
        spare = any_source.get(dst)  # rows of dst's table, as the channel's recvs
        if spare and len(plain_recvs) < len(plain_sends):  # a `recv 1<-?` takes whichever send is left
            taken = min(len(spare), len(plain_sends) - len(plain_recvs))
            plain_recvs = plain_recvs + spare[:taken]
            del spare[:taken]
        whole = (src not in streams or streams[src].p2p_whole) and (dst not in streams or streams[dst].p2p_whole)
        if whole:  # the common case: pairs go straight to columns, not through 2-tuples
            plain, batched = _pair_in_order(plain_sends, plain_recvs), _pair_in_order(batched_sends, batched_recvs)
            send_rows, recv_rows = plain[0] + batched[0], plain[1] + batched[1]
            plain_pairs = len(plain[0])
        else:
            sender_pending, receiver_pending = pending.get(src, none_pending), pending.get(dst, none_pending)
            plain_pairs_of = _pair_channel(plain_sends, plain_recvs, sender_pending, receiver_pending)
            pairs = plain_pairs_of + _pair_channel(batched_sends, batched_recvs, sender_pending, receiver_pending)
            send_rows, recv_rows = [send for send, _ in pairs], [recv for _, recv in pairs]
            plain_pairs = len(plain_pairs_of)
        channels.append((src, dst, send_rows, recv_rows, plain_pairs))
    return P2PPlan(channels, sorted(any_source.items()))


def _channel_matches(group_id: int, src: int, dst: int, send_table: Optional[EntryTable],
                     recv_table: Optional[EntryTable], sends: list[Optional[int]],
                     recvs: list[Optional[int]], plain: int) -> list[P2PMatch]:
    """A P2PMatch per pair of rows of the channel src -> dst (`sends[k]` with
    `recvs[k]`), numbered in order; no table and row -1 where that end never posted the op;
    the pairs from `plain` on are of batched ops."""
    return [(BatchedP2PMatch if ordinal >= plain else P2PMatch)(
                group_id, src, dst, ordinal, None if send is None else send_table, -1 if send is None else send,
                None if recv is None else recv_table, -1 if recv is None else recv)
            for ordinal, (send, recv) in enumerate(zip(sends, recvs))]


def match(dumps: Sequence[RankDump], layout: Layout, dealt: Optional[DealtDumps] = None,
          processes: int = 1) -> MatchResult:
    """Pair every rank's entries with its peers' (see module docstring). `dealt` holds
    the dumps dealt while loading. With `processes` of 4 or more (forked.FORK_FROM_PROCESSES),
    a large job's groups are planned in forked children meanwhile (`_plans_apart`): the
    same matches."""
    views = build_views(dumps, layout, dealt)
    return _match_views(layout, views, _plans_apart(views, processes) if may_fork(processes) else ())


def _match_views(layout: Layout, views: tuple[GroupView, ...], planned: Iterable[dict[int, GroupPlan]] = ()) -> MatchResult:
    """The matches of `views`, in their order, each group's built from its plan in
    `planned` (group id -> plan, a share of the groups at a time) where there is one, else
    planned here. Each share's matches are built as it comes in, while later shares may
    still be planned elsewhere."""
    result = MatchResult(layout, views)
    # Keyed by object ids, so they must not outlive the entries: one per call.
    signature_cache: SignatureCache = {}
    op_keys = OpKeys()
    by_id = {view.group.id: view for view in views}
    built: dict[int, tuple[list[CollectiveMatch], list[P2PMatch]]] = {}
    for plans in planned:
        for group_id, plan in plans.items():
            built[group_id] = _built(by_id[group_id], plan)
    # The index (MatchIndex.of) is made of the groups' lists as they are built.
    collectives_of: dict[int, list[CollectiveMatch]] = {}
    p2p_of: dict[int, list[P2PMatch]] = {}
    for view in views:
        done = built.pop(view.group.id, None)
        collectives, p2p = done if done is not None else _built(view, _plan_group(view, signature_cache, op_keys))
        result.collectives.extend(collectives)
        result.p2p.extend(p2p)
        if collectives:
            collectives_of[view.group.id] = collectives
        if p2p:
            p2p_of[view.group.id] = p2p
    result._index = MatchIndex(CollectiveLookup(collectives_of), collectives_of, p2p_of)
    return result


def _built(view: GroupView, plan: GroupPlan) -> tuple[list[CollectiveMatch], list[P2PMatch]]:
    """The group's matches, built from its plan."""
    return _built_collectives(view, plan.collectives), _built_p2p(view, plan.p2p)


def _plan_group(view: GroupView, signature_cache: SignatureCache, op_keys: OpKeys) -> GroupPlan:
    return GroupPlan(_plan_collectives(view, signature_cache, op_keys), _plan_p2p(view))


# --------------------------------------------------------------------------- in children

# Building the matches from the plans (here, alone) costs about this share of planning.
BUILD_SHARE = 0.3
# The entries planned per process at least: some 40 ms of work (planning reads about 6
# million entries a second), against 10 to 50 ms to fork a large job. A job of fewer than
# twice this many is planned here alone.
PLAN_ENTRIES_PER_CHILD = 250_000


def _plans_apart(views: tuple[GroupView, ...], processes: int) -> Iterator[dict[int, GroupPlan]]:
    """group id -> GroupPlan of every view, a share of the groups at a time, planned by up
    to `processes - 1` forked children (which inherit the views; only the plans come
    back) and by this process, which plans the first share meanwhile and then builds the
    matches of each share as it comes in: building every match here is counted as its
    work (BUILD_SHARE), so its own share is the smaller. A child that cannot fork, dies
    or sends what does not read back has its groups planned here. Nothing for a job too
    small to share (PLAN_ENTRIES_PER_CHILD): `_match_views` then plans as it builds."""
    work = {view.group.id: _work(view) for view in views}
    count = min(processes, sum(work.values()) // PLAN_ENTRIES_PER_CHILD)
    if count < 2:
        return iter(())
    shares = _shares(views, work, count)
    return each_in_children(_planned, [shares[0]] + [share for share in shares[1:] if share])


def _work(view: GroupView) -> int:
    """What planning a group reads: the entries its members hold in it."""
    return sum(len(stream.collectives) + len(stream.p2p) for stream in view.streams.values())


def _planned(views: Sequence[GroupView]) -> dict[int, GroupPlan]:
    signature_cache: SignatureCache = {}
    op_keys = OpKeys()
    return {view.group.id: _plan_group(view, signature_cache, op_keys) for view in views}


def _shares(views: tuple[GroupView, ...], work: dict[int, int], count: int) -> list[list[GroupView]]:
    """The views dealt into `count` shares of about equal work (group id -> the entries its
    members hold in it), the largest first to the least loaded; the first share is this
    process's, which starts loaded with building every match (BUILD_SHARE)."""
    loads = [BUILD_SHARE * sum(work.values())] + [0.0] * (count - 1)
    shares: list[list[GroupView]] = [[] for _ in range(count)]
    for view in sorted(views, key=lambda v: (-work[v.group.id], v.group.id)):
        least = loads.index(min(loads))
        shares[least].append(view)
        loads[least] += work[view.group.id]
    return shares


def rematch(result: MatchResult, dumps: list[RankDump], changed: set[int]) -> MatchResult:
    """The match of `dumps`, which differ from the dumps `result` matched only in the
    entries of the ranks in `changed`. A group's matches depend on its members' entries
    alone, so only the groups those ranks have entries in are matched again; the others
    are taken from `result` as they are."""
    if not changed:
        return result
    # The ranks' pg_ids as their full dumps show them: the ops left out may be all a rank holds of a group.
    own_ids: dict[int, dict[int, int]] = defaultdict(dict)
    held: dict[int, set[int]] = defaultdict(set)
    p2p_groups = set()
    for view in result.views:
        for rank, stream in view.streams.items():
            if stream.p2p:
                p2p_groups.add(view.group.id)  # its ranks' pg_status may count P2P work
            if rank in changed:
                if stream.pg_id is not None:
                    own_ids[rank][view.group.id] = stream.pg_id
                if stream.first_seq is not None:
                    held[rank].add(view.group.id)
    # Only-active is the job's setting, as its whole dumps showed it: trimmed dumps may no
    # longer show it (the ops left out can be those that did).
    only_active = any(stream.only_active for view in result.views for stream in view.streams.values())
    fresh = build_views([d for d in dumps if d.rank in changed], result.layout, only_active=only_active,
                        own_ids=own_ids, held=held, p2p_groups=frozenset(p2p_groups))
    touched = {view.group.id for view in fresh if any(rank in changed for rank in view.streams)}
    touched |= {view.group.id for view in result.views if any(rank in changed for rank in view.streams)}
    if not touched:
        return result
    views = tuple(_with_streams(view, fresh[view.group.id], changed) if view.group.id in touched else view
                  for view in result.views)
    partial = _match_views(result.layout, tuple(views[gid] for gid in sorted(touched)))
    kept = [m for m in result.collectives if m.group_id not in touched]
    kept_p2p = [p for p in result.p2p if p.group_id not in touched]
    return MatchResult(result.layout, views,
                       sorted(kept + partial.collectives, key=_GROUP_SEQ),
                       sorted(kept_p2p + partial.p2p, key=_GROUP_CHANNEL))


def _with_streams(view: GroupView, fresh: GroupView, changed: set[int]) -> GroupView:
    """`view` with the streams of the `changed` ranks taken from `fresh`."""
    streams = {rank: stream for rank, stream in view.streams.items() if rank not in changed}
    streams.update((rank, stream) for rank, stream in fresh.streams.items() if rank in changed)
    return GroupView(view.group, dict(sorted(streams.items())), view.no_dump)


_GROUP_SEQ = operator.attrgetter("group_id", "seq")
_GROUP_CHANNEL = operator.attrgetter("group_id", "src", "dst", "ordinal")


# Fast paths beside their plain twins (same arguments, same answers): the matcher runs the
# fast one; frtrace.testing.twins swaps in the plain one for the tests that run over both
# and for benchmarks/fast_paths.py (ARCHITECTURE.md says when a fast path may land).
PLAIN_TWINS = {"_unsettled": _every_collective}
