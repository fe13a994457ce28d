"""Program order: whether a rank absent from an op went past it or has not got there.

Takes the device view's dumps, layout and matches (through `ProgramOrder`) and a
finding; returns, per absent rank, `WentPast` evidence when the rank skipped the op.

A rank that is absent from an op because it waits in another group's op is either a
victim (in its program that other op comes first) or went past the op (it skipped it,
and blocks further on: a deadlock it caused). Sequence numbers cannot tell these apart
across groups; the order in which ranks that play the same part issued their ops can.
Ranks play the same part when their last few ops, named by group family (description
and size), sequence number, op, group-local P2P ends and signature, are the same.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from itertools import islice, repeat
from typing import Iterator, Optional, Sequence

from frtrace.diagnosis.finding import Finding, WentPast
from frtrace.load.layout import Layout
from frtrace.match.matcher import MatchResult, batch_signature
from frtrace.model import UNDESCRIBED, Entry, Group, OpName
from frtrace.table.entry_table import EntryTable
from frtrace.table.rank_dump import RankDump
from frtrace.table.seq_map import RowList
from frtrace.table.standing import keeps_only_active

LIKENESS_WINDOW = 4  # ops two ranks must share before an op to be at the same place in the program
MAX_WITNESSES = 64  # ranks that issued an op, consulted on where it comes in the program
MAX_PROFILES = 4  # distinct places in the program the witnesses may come from
# With no like rank to compare with, a rank's own past (its earlier steps) is compared:
HISTORY_RANKS = 8  # absent ranks per finding checked that way, at most
HISTORY_SPAN = 256  # ops since its last op on the channel, at most
HISTORY_TRIES = 4  # earlier occurrences of the op to compare with
_UNSEEN = object()  # a memo's "not computed yet" (None is a value)


@dataclass(slots=True)
class _Place:
    """Where one witness issued the op: its own op just before, and its ops leading there."""

    rank: int
    position: int  # of the op in the witness's entries
    before: tuple  # token of the op just before it
    window: tuple  # tokens of the LIKENESS_WINDOW ops ending with `before`


def _entry_index(entry: Entry) -> int:
    return entry.index


def p2p_seq_ids(p2p: RowList) -> list:
    """p2p_seq_id of each of a stream's P2P ops (`RankStream.p2p`), oldest first: read off
    the column, without building the entries."""
    return p2p.field("p2p_seq_id")


class ProgramOrder:
    """Each rank's own order of ops (the entries the diagnosis reasons on), and lookups
    of the op that plays the same part on another rank. Ops are found through the
    matcher's per-group indexes, so comparing ranks costs a few lookups per witness,
    and comparing a rank with its own past reads at most a few hundred of its ops."""

    def __init__(self, dumps: list[RankDump], layout: Layout, matches: MatchResult):
        views = matches.views
        # A dump of only active entries holds no order of what the rank did, only holes
        # where its finished ops were: such a rank neither judges nor is judged.
        self.entries = {d.rank: d.entries for d in dumps if not keeps_only_active(d)}
        self.layout = layout
        self.views = {v.group.id: v for v in views}
        self.family = {v.group.id: _family(v.group) for v in views}
        self.members = defaultdict(list)  # family -> group ids
        self.group_in_family: dict = {}  # (rank, family) -> group id; None when ambiguous
        for view in views:
            family = self.family[view.group.id]
            self.members[family].append(view.group.id)
            for rank in view.group.ranks:
                key = (rank, family)
                self.group_in_family[key] = None if key in self.group_in_family else view.group.id
        self._tokens: dict = {}  # (rank, position) -> token
        self._bounds: dict = {}  # (rank, position) -> (first, last) position of its batch
        self._signatures: dict = {}  # shared by batch_signature, as in the matcher
        self._batch_signatures: dict = {}  # ids of a batch's op names and shapes -> batch_signature
        self._batch_shapes: dict = {}  # ids of a batch's op names and shapes -> all of its shape but the family
        self.collectives = matches.index.at
        self._p2p_of_group = matches.index.p2p_of
        self._partners: dict = {}  # group id -> {(rank, position of its send or recv): where the other end is}
        self._p2p_seqs: dict = {}  # (group id, rank) -> p2p_seq_id of each of its P2P ops
        self._sibling_parts: dict = {}  # see sibling_part
        self._sibling_witnesses: dict = {}  # see sibling_witnesses

    def partner(self, group_id: int, rank: int, position: int) -> Optional[Entry]:
        """The entry at the other end of the rank's send or recv at `position` in the group. Indexed per group
        on first use: a diagnosis asks about the few groups its findings are in."""
        partners = self._partners.get(group_id)
        if partners is None:
            partners = self._partners[group_id] = {}
            for pair in self._p2p_of_group.get(group_id, ()):
                if pair.paired:
                    partners[(pair.src, pair.send_row)] = (pair.recv_table, pair.recv_row)
                    partners[(pair.dst, pair.recv_row)] = (pair.send_table, pair.send_row)
        other_end = partners.get((rank, position))
        return other_end[0][other_end[1]] if other_end else None

    def sibling_witnesses(self, group_id: int, local_holder: int, local_absent: int, held: tuple) -> tuple:
        """(token, [(rank, entry)]) of what the ranks at `local_absent` in the sibling groups of
        `group_id` posted as partner of the op `held` names at `local_holder`, the token most
        of them posted. Kept: the findings of a job-wide hang (one per pipeline channel) ask
        alike, and all but those of the family's first groups read the same siblings."""
        siblings = self.members[self.family[group_id]]
        # Bounded like the witnesses: one finding per pipeline channel must not visit every
        # sibling channel of a large job (that is quadratic in ranks).
        own = group_id if group_id in siblings[:MAX_WITNESSES] else None  # else the first ones are read
        key = (self.family[group_id], own, local_holder, local_absent, held)
        found = self._sibling_witnesses.get(key)
        if found is None:
            witnesses: list[tuple[int, Entry]] = []
            tokens: dict[tuple, int] = defaultdict(int)
            for sibling in islice((g for g in siblings if g != group_id), MAX_WITNESSES):
                part = self.sibling_part(sibling, local_holder, local_absent, held)
                if part is not None:
                    their_absent, partner, token = part
                    witnesses.append((their_absent, partner))
                    tokens[token] += 1
            op_token = max(tokens.items(), key=lambda kv: kv[1])[0] if tokens else None
            found = self._sibling_witnesses[key] = (op_token, witnesses) if tokens else (None, [])
        return found

    def sibling_part(self, sibling: int, local_holder: int, local_absent: int, held: tuple) -> Optional[tuple]:
        """(rank, entry, token) of what the rank at `local_absent` in group `sibling` posted
        as partner of the op `held` names at `local_holder`; None when it did not. A job-wide
        hang leaves one P2P finding per pipeline channel, and each consults the same first
        siblings of its family: cached, that costs one lookup per sibling."""
        key = (sibling, local_holder, local_absent, held)
        if key not in self._sibling_parts:
            self._sibling_parts[key] = self._sibling_part(sibling, local_holder, local_absent, held)
        return self._sibling_parts[key]

    def _sibling_part(self, sibling: int, local_holder: int, local_absent: int, held: tuple) -> Optional[tuple]:
        others = self.views[sibling].group.ranks
        if max(local_holder, local_absent) >= len(others):
            return None  # a sibling of another size plays no comparable part
        their_holder, their_absent = others[local_holder], others[local_absent]
        mine = self.find(their_holder, held)
        partner = self.partner(sibling, their_holder, mine) if mine is not None else None
        token = self.token_of(their_absent, partner) if partner is not None else None
        return (their_absent, partner, token) if token is not None else None

    # ---- positions and tokens

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

    def _batch_bounds(self, rank: int, position: int) -> tuple:
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

    def previous(self, rank: int, position: int) -> Optional[int]:
        start, _ = self._batch_bounds(rank, position)
        return self._batch_bounds(rank, start - 1)[0] if start > 0 else None

    def following(self, rank: int, position: int) -> Optional[int]:
        _, end = self._batch_bounds(rank, position)
        return end + 1 if end + 1 < len(self.entries[rank]) else None

    def token(self, rank: int, position: int) -> Optional[tuple]:
        """What names the op at `position` the same on every rank that plays its part."""
        key = (rank, position)
        if key not in self._tokens:
            self._tokens[key] = self._token(rank, position)
        return self._tokens[key]

    def _token(self, rank: int, position: int) -> Optional[tuple]:
        # The batch's shape (see _batch_shape) and its sequence number, without building
        # its entries: a rank's past is read op by op, some 100,000 ops in a large job.
        start, end = self._batch_bounds(rank, position)
        shape = self._batch_shape(rank, start, end)
        if shape is None:
            return None
        seq = self.entries[rank].value("p2p_seq_id" if shape[1] else "collective_seq_id", start)
        return (*shape[:2], seq, *shape[2:])

    def _batch_signature(self, rank: int, start: int, end: int, statics: list) -> Optional[tuple]:
        """batch_signature of the rank's entries from `start` to `end`, which hold the static
        rows `statics`. A signature reads only op names and shapes, objects ranks share:
        kept by their identity (as batch_signature keeps its own), entries are built for
        each distinct batch of the job."""
        key = tuple([id(part) for static in statics for part in (static.name, static.shapes)])
        signature = self._batch_signatures.get(key, _UNSEEN)
        if signature is _UNSEEN:
            entries = self.entries[rank][start:end + 1]
            signature = self._batch_signatures[key] = batch_signature(entries, self._signatures)
        return signature

    def token_of(self, rank: int, entry: Entry) -> Optional[tuple]:
        position = self.position(rank, entry)
        return self.token(rank, position) if position is not None else None

    def window(self, rank: int, position: int) -> tuple:
        tokens: list[Optional[tuple]] = []
        at: Optional[int] = position
        while at is not None and len(tokens) < LIKENESS_WINDOW:
            tokens.append(self.token(rank, at))
            at = self.previous(rank, at)
        return tuple(tokens)

    def find(self, rank: int, token: tuple) -> Optional[int]:
        """Position of the rank's op with this token, if it issued it."""
        family, is_p2p, seq, op, src, dst, signature = token
        gid = self.group_in_family.get((rank, family))
        stream = self.views[gid].streams.get(rank) if gid is not None else None
        if stream is None:
            return None
        if is_p2p:
            seqs = self._p2p_seqs.get((gid, rank))
            if seqs is None:
                seqs = self._p2p_seqs[(gid, rank)] = p2p_seq_ids(stream.p2p)
            i = bisect_left(seqs, seq)
            while i < len(seqs) and seqs[i] == seq:
                entry = stream.p2p[i]
                if (entry.op, entry.name.local_src, entry.name.local_dst) == (op, src, dst):
                    return self.position(rank, entry)
                i += 1
            return None
        batch = stream.collectives.get(seq)
        if batch is None or batch[0].op != op:
            return None
        return self.position(rank, batch[0])

    # ---- where an op stands in the program

    def places(self, witnesses: list, absent: tuple) -> list:
        """The distinct places (op before, ops leading there) where witnesses issued the
        op, among those some absent rank has reached (the others cannot judge it)."""
        places: dict = {}
        reached: dict = {}  # token of the op before -> whether an absent rank issued it
        for rank, entry in witnesses[:MAX_WITNESSES]:
            position = self.position(rank, entry)
            before = self.previous(rank, position) if position is not None else None
            if position is None or before is None:
                continue  # the first op kept in its buffer: nothing tells where it stands
            token = self.token(rank, before)
            if token not in reached:
                reached[token] = token is not None and any(self.find(r, token) is not None for r in absent)
            if not reached[token]:
                continue
            window = self.window(rank, before)
            if None in window:
                continue
            key = (window[0], window)
            if key not in places and len(places) == MAX_PROFILES:
                continue
            places.setdefault(key, []).append(_Place(rank, position, window[0], window))
        return list(places.values())

    def _choices(self, rank: int, places: list) -> list:
        """[(place, position of what the rank issued there, or None when nothing)] for
        every place the rank shares with the witnesses."""
        choices = []
        for place in places:
            first = place[0]
            mine = self.find(rank, first.before)
            if mine is not None and self.window(rank, mine) == first.window:
                choices.append((place, self.following(rank, mine)))
        return choices

    def went_past(self, absent: tuple, op_token: tuple, places: list) -> tuple:
        """({rank: WentPast} for the absent ranks that reached the place where their
        like ranks issued the op and issued something else there instead, the ranks
        whose like ranks were found at all)."""
        choices, placed = {}, set()
        for rank in absent:
            mine = self._choices(rank, places)
            if mine:
                placed.add(rank)
            # A few ops in common may not single out one part of the program: a rank
            # that fits one place where it stands before the op has skipped nothing.
            tokens = [self.token(rank, position) if position is not None else None for _, position in mine]
            if mine and all(token is not None and token != op_token for token in tokens):
                choices[rank] = [(place, position, token) for (place, position), token in zip(mine, tokens)
                                 if token is not None]
        # How many absent ranks made each choice at each place: a choice most like
        # ranks made is the program, not a deviation.
        same_choice: dict[tuple[int, Optional[tuple]], int] = defaultdict(int)
        for options in choices.values():
            for place, _, token in options:
                same_choice[(id(place), token)] += 1
        found = {}
        for rank, options in choices.items():
            verdicts = [self._verdict(place, token, same_choice[(id(place), token)]) for place, _, token in options]
            if all(verdict is not None for verdict in verdicts):
                place, position, _ = options[0]
                found[rank] = self._went_past(rank, position, len(place), any(verdicts))
        return found, placed

    def _verdict(self, place: list, token: tuple, same_choice: int) -> Optional[bool]:
        """Whether issuing `token` where the witnesses at `place` issued the op went
        past it: True when they issue `token` after the op (it skipped the op), False
        when most like ranks issued the op there but nothing shows `token` comes after
        it, None when the witnesses issue `token` before the op or as many like ranks
        chose it (then it is the program, and the rank has not got to the op yet)."""
        after = before = 0
        for witness in place:
            theirs = self.find(witness.rank, token)
            if theirs is not None:
                after += theirs > witness.position
                before += theirs < witness.position
        if after > before:
            return True
        if before or len(place) <= same_choice:
            return None
        return False

    def _went_past(self, rank: int, position: int, like_ranks: int, confirmed: bool) -> WentPast:
        instead = self.entries[rank][position]
        return WentPast(instead, self.layout.group_of(instead.pg_name, rank), like_ranks, confirmed)

    # ---- the rank's own past

    def _shapes(self, rank: int, start: Optional[int], stop: int, limit: int, like: Sequence = ()) -> tuple:
        """(shapes of the rank's ops from `start` up to `stop`, at most `limit` of them;
        whether that reached `stop`), read off the columns batch by batch. Every finding
        of a job-wide hang reads a few stretches of one rank's past, some 100,000 ops in
        all and hardly any twice, so neither their tokens nor their bounds are kept. A
        walk told what its stretch should begin `like` stops at the first op unlike it,
        as one that did not reach `stop`: such a stretch is no repeat of the other."""
        shapes: list[tuple] = []
        if start is None or start >= stop or limit <= 0:
            return shapes, start is None or start >= stop
        length = len(self.entries[rank])
        first, last = self._batch_bounds(rank, start)  # `start` may be inside a batch
        for first, last in self._batches_from(rank, first, last):
            shape = self._batch_shape(rank, first, last)
            if shape is None or (len(shapes) < len(like) and shape != like[len(shapes)]):
                return shapes, False
            shapes.append(shape)
            if last + 1 >= stop or len(shapes) == limit:
                break
        return shapes, last + 1 >= min(stop, length)

    def _batches_from(self, rank: int, first: int, last: int) -> Iterator[tuple[int, int]]:
        """(first, last) position of each batch from the one at `first` to `last` on,
        oldest first: the batch after one starts right after it, so only its end is looked
        for (what `_batch_bounds` finds walking both ways), each op's key read once."""
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

    def _batch_shape(self, rank: int, first: int, last: int) -> Optional[tuple]:
        """What the rank's batch from `first` to `last` is, wherever it comes: (family,
        is_p2p, op, src, dst, batch signature), or None outside every group; its token
        adds the sequence number (`_token`). Read off its static rows. Ranks share
        op names and shapes (the objects), and the ranks a hang's findings ask about each
        read a few dozen ops, mostly ones no other asked about before: kept by those
        objects, as `_batch_signature` keeps signatures, not per rank."""
        entries = self.entries[rank]
        batch = [entries.static_row(first)] if first == last else entries.static_rows(range(first, last + 1))
        gid = self.layout.group_of(batch[0].pg_name, rank)
        family = self.family.get(gid) if gid is not None else None
        if family is None:
            return None
        key = tuple([id(part) for static in batch for part in (static.name, static.shapes)])
        rest = self._batch_shapes.get(key)
        if rest is None:
            name = batch[0].name
            signature = self._batch_signature(rank, first, last, batch)
            rest = self._batch_shapes[key] = (name.is_p2p, name.op, name.local_src, name.local_dst, signature)
        return (family, *rest)

    def past_says_skipped(self, rank: int, channel: list, op_shape: Optional[tuple]) -> Optional[WentPast]:
        """With nobody like it to compare with, a rank's own past: if what it did since
        its last op on the channel (`channel`: positions, oldest first) repeats a stretch
        of its past that led up to an op shaped like the missing one (`op_shape`; None
        when every op on the channel is) and then goes on as its past went on after
        that op, it skipped the op this time."""
        if len(channel) < 2:
            return None
        start = self.following(rank, channel[-1])
        if start is None:
            return None  # it stands right after its last op there: behind
        now, whole = self._shapes(rank, start, len(self.entries[rank]), HISTORY_SPAN)
        if not whole:
            return None  # no stretch of its past can be compared with an unfinished one
        tries = 0
        for j in range(len(channel) - 1, 0, -1):
            if tries == HISTORY_TRIES:
                break
            if op_shape is not None and _shape(self.token(rank, channel[j]) or ()) != op_shape:
                continue
            tries += 1
            before, complete = self._shapes(rank, self.following(rank, channel[j - 1]), channel[j], HISTORY_SPAN, now)
            if not (whole and complete) or now[:len(before)] != before[:len(now)]:
                continue
            if len(now) <= len(before):
                return None  # still on the stretch that leads up to the op: behind
            after, _ = self._shapes(rank, self.following(rank, channel[j]), len(self.entries[rank]), len(now) - len(before))
            if now[len(before):] == after:
                return self._went_past(rank, self._nth_following(rank, start, len(before)), 0, True)
        return None

    def neighbours_say_skipped(self, rank: int, channel: list, op_shape: Optional[tuple]) -> Optional[WentPast]:
        """A rank's own past, op by op, where its steps differ too much for
        `past_says_skipped` to find a whole stretch repeated: if an op of one shape B
        always came right before the ops shaped like the missing one (`op_shape`; at
        least two of them), and every B it issued until now was followed by one, a B
        followed by an op that in its past came right after the missing op says it
        skipped the op this time. Its last HISTORY_TRIES such ops are read."""
        if op_shape is None:
            return None
        # The last HISTORY_TRIES, found newest first: the older ones' tokens are not read.
        newest_first = (p for p in reversed(channel) if _shape(self.token(rank, p) or ()) == op_shape)
        ops = list(islice(newest_first, HISTORY_TRIES))[::-1]
        if len(ops) < 2:
            return None
        befores = {self._shape_at(rank, self.previous(rank, p)) for p in ops}
        afters = {self._shape_at(rank, self.following(rank, p)) for p in ops} - {None}
        if len(befores) != 1 or None in befores:
            return None
        (before,) = befores
        position, read = self.previous(rank, ops[0]), 0
        while position is not None and read < 2 * HISTORY_SPAN:
            if self._shape_at(rank, position) == before:
                then = self.following(rank, position)
                if then is None:
                    return None  # it stands right after a B: behind
                shape = self._shape_at(rank, then)
                if shape != op_shape:
                    # The first B not followed by the op: a skip if it comes after the
                    # last op and goes on as the op used to; otherwise B is no sign.
                    skipped = position > ops[-1] and shape in afters
                    return self._went_past(rank, then, 0, True) if skipped else None
            position, read = self.following(rank, position), read + 1
        return None

    def turns_say_skipped(self, rank: int, p2p: RowList, skipped: tuple) -> Optional[WentPast]:
        """A rank whose P2P ops in a group (`p2p`, oldest first) took turns between the
        `skipped` channel and one other (a first pipeline stage's forward send and
        backward recv, one micro-batch per step: c d c d) and then posted on the other
        one twice (c d c d d) went past its op on the skipped channel: nothing in its past
        lets the second come first. Its own past says so with a single earlier step,
        where `past_says_skipped` needs two."""
        if len(p2p) < 3:
            return None
        newest = p2p[-1]
        other = _p2p_channel(newest)
        if other == skipped:
            return None
        # Newest first: other, other, skipped, other, skipped, other ... to the oldest read.
        # Read op by op, off the codes (no entry built): most ranks asked about break the
        # pattern within a few ops.
        turns = 0
        for _, name in islice(newest_p2p_names(p2p), HISTORY_SPAN):
            channel = _name_channel(name)
            if channel == skipped or channel == other:
                if channel != (skipped if turns % 2 == 0 and turns > 0 else other):
                    return None
                turns += 1
        if turns < 3:
            return None
        position = self.position(rank, newest)
        return self._went_past(rank, position, 0, True) if position is not None else None

    def _shape_at(self, rank: int, position: Optional[int]) -> Optional[tuple]:
        return self._batch_shape(rank, *self._batch_bounds(rank, position)) if position is not None else None

    def _nth_following(self, rank: int, position: int, n: int) -> int:
        at: Optional[int] = position
        for _ in range(n):
            assert at is not None  # the caller counted these ops
            at = self.following(rank, at)
        assert at is not None
        return at


def _collective_witnesses(order: ProgramOrder, finding: Finding) -> tuple:
    """(token, [(rank, entry)]) of the op a collective finding is about, as issued by
    the ranks waiting in it and by the members of its sibling groups."""
    gid, seq = finding.group_id, finding.collective_seq_id
    match = order.collectives.get((gid, seq)) if gid is not None and seq is not None else None
    issuer = next((r for r in finding.waiting_ranks if match and r in match.calls), None)
    if issuer is None or match is None or gid is None or seq is None:
        return None, []
    op_token = order.token_of(issuer, match.calls[issuer][0])
    if op_token is None:
        return None, []
    near = finding.absent_ranks[0]
    witnesses = sorted(((r, e[0]) for r, e in match.calls.items()), key=lambda c: (abs(c[0] - near), c[0]))
    for sibling in order.members[order.family[gid]]:
        if len(witnesses) >= MAX_WITNESSES:
            break
        other = order.collectives.get((sibling, seq)) if sibling != gid else None
        if other is not None:
            witnesses.extend((r, e[0]) for r, e in sorted(other.calls.items()))
    return op_token, witnesses[:MAX_WITNESSES]


def _p2p_witnesses(order: ProgramOrder, finding: Finding) -> tuple:
    """(token, [(rank, entry)]) of the send or recv a P2P finding says was never posted,
    as posted by the ranks that play the absent rank's part in sibling groups."""
    ends = finding.p2p_ends
    view = order.views.get(finding.group_id) if finding.group_id is not None else None
    if ends is None or finding.anchor is None or view is None or not {ends.posted_by, ends.missing_on} <= set(view.group.ranks):
        return None, []  # an end outside the group (a stray rank, `recv ?`): no part to compare
    held = order.token_of(ends.posted_by, finding.anchor)
    if held is None:
        return None, []
    ranks = view.group.ranks
    return order.sibling_witnesses(view.group.id, ranks.index(ends.posted_by), ranks.index(ends.missing_on), held)


def _channel(order: ProgramOrder, finding: Finding, rank: int) -> list:
    """Positions of the rank's earlier ops on the finding's channel, oldest first: its
    collectives of the group before the op, or its P2P ops like the one never posted."""
    view = order.views.get(finding.group_id) if finding.group_id is not None else None
    stream = view.streams.get(rank) if view else None
    if stream is None:
        return []
    if finding.kind == "p2p_unmatched":
        wanted = _unposted_channel(finding)
        newest_first = (k for k, name in newest_p2p_names(stream.p2p) if _name_channel(name) == wanted)
        positions = (order.p2p_position(rank, stream.p2p, k) for k in newest_first)
        # Every op on the channel is like the one never posted, so `past_says_skipped`
        # reads no further back than its last HISTORY_TRIES + 1: finding the rest would
        # scan a long pipeline run's every send and recv, once per finding.
        return list(islice((p for p in positions if p is not None), HISTORY_TRIES + 1))[::-1]
    collectives = stream.collectives
    assert finding.collective_seq_id is not None  # a collective's finding (see went_past_finding)
    seqs = [s for s in sorted(collectives) if s < finding.collective_seq_id]
    # Rows of the rank's table: its ops placed without building them.
    positions = (order.row_position(rank, collectives.table, row) for row in collectives.first_rows(seqs))
    return [p for p in positions if p is not None]


def went_past_finding(order: ProgramOrder, finding: Finding, ranks: tuple[int, ...]) -> dict[int, WentPast]:
    """rank -> WentPast for those of `ranks` (absent from the finding, waiting
    elsewhere) that went past its op."""
    if finding.kind == "p2p_unmatched":
        if finding.anchor is None:
            return {}
        op_token, witnesses = _p2p_witnesses(order, finding)
    elif finding.collective_seq_id is not None and finding.group_id is not None:
        op_token, witnesses = _collective_witnesses(order, finding)
        if op_token is None:
            return {}
    else:
        return {}
    absent = tuple(r for r in ranks if r in order.entries)
    found, placed = {}, set()
    if op_token is not None:
        witnesses = [(r, e) for r, e in witnesses if order.token_of(r, e) == op_token]
        places = order.places(witnesses, absent)
        if places and absent:
            found, placed = order.went_past(absent, op_token, places)
    # Every op on a P2P channel is like the one never posted; collectives vary.
    op_shape = None if finding.kind == "p2p_unmatched" else _shape(op_token)
    # Ranks no like rank could judge are compared with their own past: a rank no like
    # rank plays the part of, as a whole; one whose like ranks split (as many chose one
    # way as the other), only by the stricter tests (op by op, or turns on P2P channels).
    unplaced = [r for r in absent if r not in placed]
    split = [r for r in absent if r in placed and r not in found]
    for rank in unplaced if len(unplaced) <= HISTORY_RANKS else ():
        channel = _channel(order, finding, rank)
        past = order.past_says_skipped(rank, channel, op_shape)
        if past is None and finding.kind == "p2p_unmatched":
            past = _turns_say_skipped(order, finding, rank)
        elif past is None:
            past = order.neighbours_say_skipped(rank, channel, op_shape)
        if past is not None:
            found[rank] = past
    for rank in split if len(split) <= HISTORY_RANKS else ():
        if finding.kind == "p2p_unmatched":
            past = _turns_say_skipped(order, finding, rank)
        else:
            past = order.neighbours_say_skipped(rank, _channel(order, finding, rank), op_shape)
        if past is not None:
            found[rank] = past
    return found


def _p2p_channel(entry: Entry) -> tuple:
    return _name_channel(entry.name)


def _name_channel(name: OpName) -> tuple:
    """The channel of a send or recv named `name`: (op, group-local src, dst)."""
    return name.op, name.local_src, name.local_dst


def newest_p2p_names(p2p: RowList) -> Iterator[tuple[int, OpName]]:
    """(k, op name) of a stream's P2P ops (`RankStream.p2p`), newest first: read off the
    codes one by one (readers stop after a few), without building the entries."""
    return p2p.names_newest_first()


def _turns_say_skipped(order: ProgramOrder, finding: Finding, rank: int) -> Optional[WentPast]:
    view = order.views.get(finding.group_id) if finding.group_id is not None else None
    stream = view.streams.get(rank) if view else None
    return order.turns_say_skipped(rank, stream.p2p, _unposted_channel(finding)) if stream else None


def _unposted_channel(finding: Finding) -> tuple:
    """The channel (op, group-local src, dst) of the send or recv a P2P finding says was
    never posted: the other end of its anchor."""
    anchor = finding.anchor
    assert anchor is not None  # P2P findings hold the op that was posted
    return "recv" if anchor.op == "send" else "send", anchor.name.local_src, anchor.name.local_dst


def _shape(token: tuple) -> tuple:
    """A token without its sequence number: what the op is, wherever it comes."""
    return token[:2] + token[3:]


def _family(group: Group) -> tuple:
    """Groups of one family run the same program (the TP groups, the DP groups ...)."""
    return (group.desc, group.size) if group.desc not in UNDESCRIBED else ("", group.name, group.size)


# --------------------------------------------------------------------------- roots


# When findings explain each other in a circle, the most fundamental kind is the root.
