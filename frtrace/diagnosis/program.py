"""Reading one rank's program: the order of its ops, and the typed token that names each.

Takes the device view's dumps, layout and matches; returns `Programs`, which answers,
per rank, where an entry stands in its program, the batches before and after it, and
the `Token` (`OpForm` and sequence number) that names an op the same on every rank that
plays its part. Ops are found through the matcher's per-group indexes, so a lookup on
another rank costs a few steps; each rank's past is read off the columns, without
building its entries.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from itertools import repeat
from typing import Iterator, NamedTuple, Optional, Sequence

from frtrace.diagnosis.finding import WentPast
from frtrace.load.layout import Layout
from frtrace.match.matcher import (
    CollectiveLookup,
    GroupView,
    MatchResult,
    P2PMatch,
    RankStream,
    Signature,
    SignatureCache,
    batch_signature,
)
from frtrace.model import Entry, Family, OpName, family_of
from frtrace.table.entry_table import EntryTable, StaticRow
from frtrace.table.rank_dump import RankDump
from frtrace.table.seq_map import RowList
from frtrace.table.standing import blocked_at, keeps_only_active

LIKENESS_WINDOW = 4  # ops two ranks must share before an op to be at the same place in the program

# A rank's newest P2P ops in a group that a skip is looked for in, and its like ranks'
# newest ones it is compared with: more of theirs, as they may have gone further.
HISTORY_P2P_OPS = 64
LIKE_HISTORY_P2P_OPS = 256

# Groups of one family run the same program: (description, size), or ("", name, size)
# for a group without a description.
Channel = tuple[str, Optional[int], Optional[int]]  # a send or recv: (op, group-local src, dst)


@dataclass(frozen=True, slots=True)
class P2POps:
    """Some of a rank's sends and recvs in a group, oldest first, as ranks that play its
    part compare them: each one's p2p_seq_id and channel, in two lists (compared a list
    at a time, in C)."""

    seqs: list[int]
    channels: list[Channel]
    first: int  # the place of the first among the rank's P2P ops in the group (RankStream.p2p)

    def __len__(self) -> int:
        return len(self.seqs)

    def since(self, start: int) -> "P2POps":
        """The ops from the first numbered `start` or later on (numbers grow along a stream)."""
        cut = bisect_left(self.seqs, start)
        return P2POps(self.seqs[cut:], self.channels[cut:], self.first + cut)


NO_P2P_OPS = P2POps([], [], 0)


class OpForm(NamedTuple):
    """What an op (a batch of them: its first) is, wherever it comes in the program."""

    family: Family
    is_p2p: bool
    op: str
    src: Optional[int]  # group-local P2P ends (None for a collective)
    dst: Optional[int]
    signature: Signature  # batch_signature of the batch


class Token(NamedTuple):
    """What names an op the same on every rank that plays its part: its form, and its
    sequence number (P2P or collective) in its group. Ordered as the form with `seq` third."""

    family: Family
    is_p2p: bool
    seq: int
    op: str
    src: Optional[int]
    dst: Optional[int]
    signature: Signature

    @property
    def form(self) -> OpForm:
        return OpForm(self.family, self.is_p2p, self.op, self.src, self.dst, self.signature)


Window = tuple[Optional[Token], ...]  # tokens of the ops leading to one, newest first
Bounds = tuple[int, int]  # (first, last) position of a batch
# A batch's form but its family, kept by the static rows' op names and tensor shapes.
_FormRest = tuple[bool, str, Optional[int], Optional[int], Signature]


def form_of(token: Optional[Token]) -> Optional[OpForm]:
    return token.form if token is not None else None




def name_channel(name: OpName) -> Channel:
    """The channel of a send or recv named `name`: (op, group-local src, dst)."""
    return name.op, name.local_src, name.local_dst


def p2p_channel(entry: Entry) -> Channel:
    return name_channel(entry.name)


def p2p_seq_ids(p2p: RowList) -> list[int]:
    """p2p_seq_id of each of a stream's P2P ops (`RankStream.p2p`), oldest first: read off
    the column, without building the entries."""
    return p2p.field("p2p_seq_id")


def newest_p2p_names(p2p: RowList) -> Iterator[tuple[int, OpName]]:
    """(k, op name) of a stream's P2P ops (`RankStream.p2p`), newest first: read off the
    codes one by one (readers stop after a few), without building the entries."""
    return p2p.names_newest_first()


def stream_p2p_ops(stream: RankStream, count: int = HISTORY_P2P_OPS) -> P2POps:
    """newest_p2p_ops of the rank's P2P ops in a group; none where its dump of only active
    entries left some out (it holds its P2P order only where it holds every op it posted
    since its oldest held one: batches, whose ops never look finished, numbered with no
    gap)."""
    if stream.p2p_whole or not stream.only_active or _numbered_without_gaps(stream.p2p):
        return newest_p2p_ops(stream.p2p, count)
    return NO_P2P_OPS


def _numbered_without_gaps(p2p: RowList) -> bool:
    """Whether the P2P numbers held run from the oldest to the newest with none missing: a
    finished plain op left out of a dump of only active entries leaves a gap."""
    seqs = p2p.field("p2p_seq_id")
    if not seqs or not all(type(n) is int for n in seqs):
        return False
    numbers: set[int] = set(seqs)
    return len(numbers) == max(numbers) - min(numbers) + 1


def newest_p2p_ops(p2p: RowList, count: int = HISTORY_P2P_OPS) -> P2POps:
    """A stream's newest `count` P2P ops, read off the codes; none where a number is not
    an int."""
    newest = p2p.newest(count)
    seqs = newest.field("p2p_seq_id")
    if not all(type(seq) is int for seq in seqs):
        return NO_P2P_OPS  # numbers torch never writes: nothing to compare op by op
    return P2POps(seqs, list(map(name_channel, newest.names())), len(p2p) - len(newest))


def _entry_index(entry: Entry) -> int:
    return entry.index


def _static_parts_key(statics: Sequence[StaticRow]) -> tuple[int, ...]:
    """The identity of a batch's op names and tensor shapes, objects ranks share."""
    return tuple([id(part) for static in statics for part in (static.name, static.shapes)])


class Programs:
    """Each rank's own order of ops (the entries the diagnosis reasons on), the groups
    that play the same part, and lookups of an op on another rank. What is read per op
    (tokens, batch bounds) is kept: the findings of one hang ask about the same ops."""

    def __init__(self, dumps: list[RankDump], layout: Layout, matches: MatchResult):
        views = matches.views
        # A dump of only active entries holds no order of what the rank did, only holes
        # where its finished ops were: such a rank neither judges nor is judged.
        self.entries: dict[int, EntryTable] = {d.rank: d.entries for d in dumps if not keeps_only_active(d)}
        self.layout = layout
        self.views: dict[int, GroupView] = {v.group.id: v for v in views}
        self.family: dict[int, Family] = {v.group.id: family_of(v.group) for v in views}
        self.members: dict[Family, list[int]] = defaultdict(list)  # family -> group ids
        self.group_in_family: dict[tuple[int, Family], Optional[int]] = {}  # None when ambiguous
        for view in views:
            family = self.family[view.group.id]
            self.members[family].append(view.group.id)
            for rank in view.group.ranks:
                key = (rank, family)
                self.group_in_family[key] = None if key in self.group_in_family else view.group.id
        self.collectives: CollectiveLookup = matches.index.at
        self._p2p_of_group: dict[int, list[P2PMatch]] = matches.index.p2p_of
        self._tokens: dict[tuple[int, int], Optional[Token]] = {}  # (rank, position) -> token
        self._bounds: dict[tuple[int, int], Bounds] = {}  # (rank, position) -> its batch's
        self._signatures: SignatureCache = {}  # shared by batch_signature, as in the matcher
        self._batch_signatures: dict[tuple[int, ...], Signature] = {}  # see _batch_signature
        self._form_rests: dict[tuple[int, ...], _FormRest] = {}  # see form
        # group id -> {(rank, position of its send or recv): (table, row) of the other end}
        self._partners: dict[int, dict[tuple[int, int], tuple[EntryTable, int]]] = {}
        self._p2p_seqs: dict[tuple[int, int], list[int]] = {}  # (group id, rank) -> p2p_seq_ids
        self._p2p_ops: dict[tuple[int, int, int], P2POps] = {}  # (group id, rank, count) -> see p2p_ops

    # ---- where a rank stands

    def in_flight_with_its_group(self, rank: int) -> bool:
        """Whether the rank waits in a collective that every member of its group holds and
        none has finished: the op is in flight (or stuck) for all of them alike, and the
        ops that come after it in the rank's program are still to come."""
        entries = self.entries.get(rank)
        if not entries:
            return False
        position = blocked_at(entries)
        if position >= len(entries):
            return False
        entry = entries[position]
        group_id = self.layout.group_of(entry.pg_name, rank)
        if entry.is_p2p or group_id is None:
            return False
        match = self.collectives.get((group_id, entry.collective_seq_id))
        return match is not None and match.held_by_all_unfinished

    # ---- positions

    def position(self, rank: int, entry: Entry) -> Optional[int]:
        entries = self.entries.get(rank, ())
        i = entry.index
        if i >= len(entries) or entries[i] != entry:
            i = bisect_left(entries, entry.index, key=_entry_index)
        return i if i < len(entries) and entries[i] == entry else None

    def p2p_position(self, rank: int, p2p: RowList, k: int) -> Optional[int]:
        """position of the rank's `k`-th P2P op in a group (`p2p`: RankStream.p2p)."""
        return self.row_position(rank, p2p.table, p2p.row(k))

    def row_position(self, rank: int, table: EntryTable, row: int) -> Optional[int]:
        """position of the rank's entry at `row` of `table`. A row of the rank's own table
        whose entry says it stands at its own index needs no entry built: that is where
        `position` finds it."""
        if table is self.entries.get(rank) and table.value("index", row) == row:
            return row
        return self.position(rank, table[row])

    def partner(self, group_id: int, rank: int, position: int) -> Optional[Entry]:
        """The entry at the other end of the rank's send or recv at `position` in the group. Indexed per group
        on first use: a diagnosis asks about the few groups its findings are in."""
        partners = self._partners.get(group_id)
        if partners is None:
            partners = self._partners[group_id] = {}
            for pair in self._p2p_of_group.get(group_id, ()):
                if pair.paired:
                    assert pair.send_table is not None and pair.recv_table is not None  # paired
                    partners[(pair.src, pair.send_row)] = (pair.recv_table, pair.recv_row)
                    partners[(pair.dst, pair.recv_row)] = (pair.send_table, pair.send_row)
        other_end = partners.get((rank, position))
        return other_end[0][other_end[1]] if other_end else None

    # ---- batches, one after another

    def batch_bounds(self, rank: int, position: int) -> Bounds:
        """(first, last) position of the batch the op at `position` is in (itself, alone).
        Kept for every op of the batch: walking a rank's past asks for each op's twice."""
        bounds = self._bounds.get((rank, position))
        if bounds is None:
            entries = self.entries[rank]
            key = entries.batch_key(position)
            start = end = position
            while start > 0 and entries.batch_key(start - 1) == key:
                start -= 1
            while end + 1 < len(entries) and entries.batch_key(end + 1) == key:
                end += 1
            bounds = (start, end)
            self._bounds.update(dict.fromkeys(zip(repeat(rank), range(start, end + 1)), bounds))
        return bounds

    def op_in_batch(self, rank: int, position: int, channel: Channel) -> Optional[int]:
        """Position of the op on `channel` in the rank's batch holding `position`; None
        when the batch has none."""
        start, end = self.batch_bounds(rank, position)
        entries = self.entries[rank]
        for at in range(start, end + 1):
            name = entries.static_row(at).name
            if (name.op, name.local_src, name.local_dst) == channel:
                return at
        return None

    def previous(self, rank: int, position: int) -> Optional[int]:
        start, _ = self.batch_bounds(rank, position)
        return self.batch_bounds(rank, start - 1)[0] if start > 0 else None

    def following(self, rank: int, position: int) -> Optional[int]:
        _, end = self.batch_bounds(rank, position)
        return end + 1 if end + 1 < len(self.entries[rank]) else None

    def nth_following(self, rank: int, position: int, n: int) -> int:
        at: Optional[int] = position
        for _ in range(n):
            assert at is not None  # the caller counted these ops
            at = self.following(rank, at)
        assert at is not None
        return at

    def batches_from(self, rank: int, first: int, last: int) -> Iterator[Bounds]:
        """(first, last) position of each batch from the one at `first` to `last` on,
        oldest first: the batch after one starts right after it, so only its end is looked
        for (what `batch_bounds` finds walking both ways), each op's key read once."""
        entries = self.entries[rank]
        length, batch_key = len(entries), entries.batch_key
        yield first, last
        at = last + 1
        key = batch_key(at) if at < length else None
        while at < length:
            first = last = at
            at += 1
            following = batch_key(at) if at < length else None
            while following == key:
                last, at = at, at + 1
                following = batch_key(at) if at < length else None
            yield first, last
            key = following

    # ---- tokens and forms

    def token(self, rank: int, position: int) -> Optional[Token]:
        """What names the op at `position` the same on every rank that plays its part."""
        key = (rank, position)
        if key not in self._tokens:
            self._tokens[key] = self._token(rank, position)
        return self._tokens[key]

    def _token(self, rank: int, position: int) -> Optional[Token]:
        # The batch's form and its sequence number, without building its entries: a
        # rank's past is read op by op, some 100,000 ops in a large job.
        start, end = self.batch_bounds(rank, position)
        form = self.form(rank, start, end)
        if form is None:
            return None
        seq = self.entries[rank].value("p2p_seq_id" if form.is_p2p else "collective_seq_id", start)
        return Token(form.family, form.is_p2p, seq, form.op, form.src, form.dst, form.signature)

    def token_of(self, rank: int, entry: Entry) -> Optional[Token]:
        position = self.position(rank, entry)
        return self.token(rank, position) if position is not None else None

    def form(self, rank: int, first: int, last: int) -> Optional[OpForm]:
        """The form of the rank's batch from `first` to `last`, or None outside every
        group. Read off its static rows. Ranks share op names and tensor shapes (the
        objects), and the ranks a hang's findings ask about each read a few dozen ops,
        mostly ones no other asked about before: kept by those objects, as
        `_batch_signature` keeps signatures, not per rank."""
        entries = self.entries[rank]
        batch = [entries.static_row(first)] if first == last else entries.static_rows(range(first, last + 1))
        gid = self.layout.group_of(batch[0].pg_name, rank)
        family = self.family.get(gid) if gid is not None else None
        if family is None:
            return None
        key = _static_parts_key(batch)
        rest = self._form_rests.get(key)
        if rest is None:
            name = batch[0].name
            signature = self._batch_signature(rank, first, last, batch)
            rest = self._form_rests[key] = (name.is_p2p, name.op, name.local_src, name.local_dst, signature)
        return OpForm(family, *rest)

    def form_at(self, rank: int, position: Optional[int]) -> Optional[OpForm]:
        return self.form(rank, *self.batch_bounds(rank, position)) if position is not None else None

    def _batch_signature(self, rank: int, start: int, end: int, statics: list[StaticRow]) -> Signature:
        """batch_signature of the rank's entries from `start` to `end`, which hold the static
        rows `statics`. A signature reads only op names and tensor shapes, objects ranks
        share: kept by their identity (as batch_signature keeps its own), entries are built
        for each distinct batch of the job."""
        key = _static_parts_key(statics)
        if key not in self._batch_signatures:  # None is a signature too (an unreadable one)
            entries = self.entries[rank][start:end + 1]
            self._batch_signatures[key] = batch_signature(entries, self._signatures)
        return self._batch_signatures[key]

    def forms_from(self, rank: int, start: Optional[int], stop: int, limit: int,
                   like: Sequence[OpForm] = ()) -> tuple[list[OpForm], bool]:
        """(forms of the rank's ops from `start` up to `stop`, at most `limit` of them;
        whether that reached `stop`), read off the columns batch by batch. Every finding
        of a job-wide hang reads a few stretches of one rank's past, some 100,000 ops in
        all and hardly any twice, so neither their tokens nor their bounds are kept. A
        walk told what its stretch should begin `like` stops at the first op unlike it,
        as one that did not reach `stop`: such a stretch is no repeat of the other."""
        forms: list[OpForm] = []
        if start is None or start >= stop or limit <= 0:
            return forms, start is None or start >= stop
        length = len(self.entries[rank])
        first, last = self.batch_bounds(rank, start)  # `start` may be inside a batch
        for first, last in self.batches_from(rank, first, last):
            form = self.form(rank, first, last)
            if form is None or (len(forms) < len(like) and form != like[len(forms)]):
                return forms, False
            forms.append(form)
            if last + 1 >= stop or len(forms) == limit:
                break
        return forms, last + 1 >= min(stop, length)

    def window(self, rank: int, position: int) -> Window:
        """Tokens of the LIKENESS_WINDOW ops ending with the one at `position`, newest first."""
        tokens: list[Optional[Token]] = []
        at: Optional[int] = position
        while at is not None and len(tokens) < LIKENESS_WINDOW:
            tokens.append(self.token(rank, at))
            at = self.previous(rank, at)
        return tuple(tokens)

    # ---- the op that plays the same part on another rank

    def find(self, rank: int, token: Token) -> Optional[int]:
        """Position of the rank's op with this token, if it issued it."""
        gid = self.group_in_family.get((rank, token.family))
        stream = self.views[gid].streams.get(rank) if gid is not None else None
        if gid is None or stream is None:
            return None
        if token.is_p2p:
            return self._find_p2p(rank, gid, stream.p2p, token)
        batch = stream.collectives.get(token.seq)
        if batch is None or batch[0].op != token.op:
            return None
        return self.position(rank, batch[0])

    def newest_collective(self, rank: int, family: Family) -> Optional[int]:
        """The number of the newest collective the rank holds of its group of `family`;
        None where it has no such group (or holds none of it)."""
        gid = self.group_in_family.get((rank, family))
        stream = self.views[gid].streams.get(rank) if gid is not None else None
        return stream.last_seq if stream is not None else None

    def _find_p2p(self, rank: int, gid: int, p2p: RowList, token: Token) -> Optional[int]:
        seqs = self._p2p_seqs.get((gid, rank))
        if seqs is None:
            seqs = self._p2p_seqs[(gid, rank)] = p2p_seq_ids(p2p)
        i = bisect_left(seqs, token.seq)
        while i < len(seqs) and seqs[i] == token.seq:
            entry = p2p[i]
            if (entry.op, entry.name.local_src, entry.name.local_dst) == (token.op, token.src, token.dst):
                return self.position(rank, entry)
            i += 1
        return None

    def p2p_ops(self, group_id: int, rank: int, count: int = HISTORY_P2P_OPS) -> P2POps:
        """stream_p2p_ops of the rank's stream in the group, kept (the findings of one hang
        ask about the same like ranks); none where it has no stream there."""
        key = (group_id, rank, count)
        ops = self._p2p_ops.get(key)
        if ops is None:
            view = self.views.get(group_id)
            stream = view.streams.get(rank) if view is not None else None
            ops = self._p2p_ops[key] = stream_p2p_ops(stream, count) if stream is not None else NO_P2P_OPS
        return ops

    def went_past(self, rank: int, position: int, like_ranks: int, confirmed: bool) -> WentPast:
        """The evidence that the rank issued its op at `position` where it should have
        issued the missing one."""
        instead = self.entries[rank][position]
        return WentPast(instead, self.layout.group_of(instead.pg_name, rank), like_ranks, confirmed)
