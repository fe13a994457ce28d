"""What every rule reads: the pipeline's `Analysis`, seen as the diagnosis needs it.

Takes an `Analysis`; returns `Facts` (the device view's matches per group, the sibling
groups of each group, where each rank is blocked) and a `new_finding` helper that fills
in a finding's group. Nothing here matches again: the pipeline matched once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, Callable, Iterator, Optional, Sequence

from frtrace.diagnosis.finding import Finding, LikePartnerPosted, LikeRankAhead
from frtrace.diagnosis.kinds import kind as kind_row
from frtrace.diagnosis.waits import Waits, waits_of
from frtrace.match.analysis import Analysis
from frtrace.match.matcher import (
    CollectiveMatch,
    GroupView,
    MatchIndex,
    MatchResult,
    P2PMatch,
    RankStream,
    Signature,
    batch_signature,
)
from frtrace.model import Entry, Family, PgStatus, family_of
from frtrace.table.rank_dump import RankDump
from frtrace.table.standing import blocked_entries
from frtrace.wording import group_text, op_text


@dataclass(slots=True)
class StepMemo:
    """What `Siblings.in_step_at` read, for one diagnosis: each group's agreed signature at
    a number, each distinct past asked about (its token), and whether a group ran alike
    at the past of a token."""

    signatures: dict[tuple[int, int], Optional[Signature]] = field(default_factory=dict)
    pasts: dict[tuple[tuple[int, Signature], ...], int] = field(default_factory=dict)
    alike: dict[tuple[int, int], bool] = field(default_factory=dict)


# The fewest numbers of a group's recent past that a sibling group must be seen to have
# run alike before it counts as in step with it (see Siblings._ran_alike).
MIN_STEPS_ALIKE = 2


@dataclass(slots=True)
class Siblings:
    """The other groups with the same description and size (the other TP groups of
    a TP group, and so on): in an SPMD program they run the same ops."""

    family: list[GroupView]  # every group of the family, this one included
    group_id: int  # this one
    index: MatchIndex
    # What `in_step_at` read, kept for the diagnosis (Facts holds it): a tie in each of a
    # thousand pairs asks each sibling the same.
    memo: StepMemo

    @property
    def views(self) -> list[GroupView]:
        return [v for v in self.family if v.group.id != self.group_id]

    def matches_at(self, seq: int) -> list[CollectiveMatch]:
        return [m for m in self.each_at(seq) if m is not None]

    def any_ran(self, seq: int) -> bool:
        """Whether another group of the family ran collective `seq` (see `ran`)."""
        return any(self.ran(view, seq) for view in self.views)

    def ran(self, sibling: GroupView, seq: int) -> bool:
        """Whether the sibling group ran collective `seq`: every member issued it, or, in
        a job whose dumps keep only active entries, a member's pg_status says it finished
        it (such a group holds no entry of the op, nor a match, yet no member finishes a
        collective that the others did not join)."""
        match = self.index.at.get((sibling.group.id, seq))
        if match is not None and match.calls and not match.not_issued:
            return True
        return _finished_by_one(sibling, seq)

    def in_step_at(self, seq: int, past: Sequence[tuple[int, Signature]]) -> list[CollectiveMatch]:
        """`matches_at(seq)` of the other groups at the same place in the program as this
        one: at each collective of `past` (this group's, agreed, just before `seq`: its
        number and what its members issued) each ran the same op. Groups alike in
        description and size may run programs of their own, the same number another op
        in each: the TP groups of a pipeline's stages, one of which also runs the loss's.
        With no `past` to compare (dumps of only active entries), every other group."""
        if not past:
            return self.matches_at(seq)
        at, memo = self.index.at, self.memo
        token = memo.pasts.setdefault(tuple(past), len(memo.pasts))
        return [match for view in self.views
                if (match := at.get((view.group.id, seq))) is not None and self._ran_alike(view.group.id, past, token)]

    def _ran_alike(self, group_id: int, past: Sequence[tuple[int, Signature]], token: int) -> bool:
        """Whether the group ran what `past` says at each of its numbers that the group's
        dumps still hold, and at two of them at least (or all, when `past` is shorter). A
        number no member's dump holds any more (its ring wrapped past it) says nothing
        either way: the group has later numbers, so it ran one there."""
        alike = self.memo.alike.get((group_id, token))
        if alike is None:
            held = [(number, signature) for number, signature in past if self._holds(group_id, number)]
            alike = self.memo.alike[group_id, token] = len(held) >= min(MIN_STEPS_ALIKE, len(past)) and all(
                self._agreed_at(group_id, number) == signature for number, signature in held)
        return alike

    def _holds(self, group_id: int, seq: int) -> bool:
        """Whether some member's dump holds the group's collective `seq`."""
        match = self.index.at.get((group_id, seq))
        return match is not None and bool(match.calls)

    def _agreed_at(self, group_id: int, seq: int) -> Optional[Signature]:
        signatures = self.memo.signatures
        key = (group_id, seq)
        if key not in signatures:
            signatures[key] = agreed_signature(self.index.at.get(key))
        return signatures[key]

    def each_at(self, seq: int) -> Iterator[Optional[CollectiveMatch]]:
        """Each other group's match at `seq` (None where it has none), read as asked: a
        caller that stops at the first one unlike its own reads no further."""
        return (self.index.at.get((v.group.id, seq)) for v in self.family if v.group.id != self.group_id)


def agreed_signature(match: Optional[CollectiveMatch]) -> Optional[Signature]:
    """What every member issued at `match` (op names, sizes, dtypes), when they all issued
    it alike; else None."""
    if match is None or match.disagreement is not None or not match.calls or match.not_issued:
        return None
    return batch_signature(next(iter(match.calls.values())))


def _unfinished_like(pair: P2PMatch, sends: bool, number: int) -> bool:
    """Whether the pair's holder end (the send where `sends`, else the recv) is the rank's
    op #`number`, unfinished, and its other end, where posted, is unfinished too."""
    mine, other = (pair.send, pair.recv) if sends else (pair.recv, pair.send)
    return (mine is not None and not mine.completed and mine.p2p_seq_id == number
            and (other is None or not other.completed))


def _finished_by_one(view: GroupView, seq: int) -> bool:
    return any(stream.only_active and stream.finished is not None and stream.finished >= seq
               for stream in view.streams.values())


MAX_P2P_SKIPPED = 4  # P2P ops a rank may have left out where a like rank ran them (a step is one or two)
MAX_SIBLINGS_ASKED = 64  # sibling groups read for a like rank (a job's pipelines are many alike)


@dataclass(slots=True)
class Facts:
    analysis: Analysis
    reliable: bool  # the dumps say when ops finish (gloo's do not)
    device: MatchResult  # every rank's entries up to where it is blocked, matched
    seen: list[RankDump]  # the dumps behind `device`
    # rank -> the entry of the op it is blocked in (`standing.blocked_at` of its dump in
    # `seen`), read once for every rule that asks; empty without completion states
    blocked_entry: dict[int, Entry]
    _families: dict[Family, list[GroupView]]
    # group id -> index in its matches of the first op members disagree on or some never
    # issued (None: they agree on all they hold); read by the divergence and frontier rules
    divergence_at: dict[int, Optional[int]]
    _waits: Optional[Waits] = None
    _dumps_by_rank: Optional[dict[int, RankDump]] = None
    _whole_dumps_by_rank: Optional[dict[int, RankDump]] = None
    _step_memo: StepMemo = field(default_factory=StepMemo)  # see Siblings.memo
    _members_of: dict[Family, dict[int, GroupView]] = field(default_factory=dict)  # see _group_in_family
    # group id -> (src, dst) -> its P2P pairs, built for the groups asked about (p2p_on)
    _channels: dict[int, dict[tuple[int, int], list[P2PMatch]]] = field(default_factory=dict)

    @property
    def waits(self) -> Waits:
        """Who waits on whom (`waits.waits_of`), worked out on first use."""
        if self._waits is None:
            self._waits = waits_of(self.blocked_entry, self.device, self.reliable)
        return self._waits

    @classmethod
    def of(cls, analysis: Analysis) -> "Facts":
        families: dict[Family, list[GroupView]] = defaultdict(list)
        for view in analysis.device.views:
            families[family_of(view.group)].append(view)
        # The device view leaves out only ops queued behind the one a rank is blocked in:
        # it is blocked in the same op as its whole dump says.
        blocked = blocked_entries(analysis.device_dumps) if analysis.reliable else {}
        index = analysis.device.index
        behind = _BehindOnDevice(analysis, blocked)
        divergence_at = {view.group.id: _first_divergence(index.collectives_of.get(view.group.id, []), analysis.reliable,
                                                          behind)
                         for view in analysis.device.views}
        return cls(analysis, analysis.reliable, analysis.device, analysis.device_dumps, blocked,
                   dict(families), divergence_at)

    @property
    def index(self) -> MatchIndex:
        return self.device.index

    def collectives_of(self, view: GroupView) -> list[CollectiveMatch]:
        return self.index.collectives_of.get(view.group.id, [])

    def p2p_of(self, view: GroupView) -> list[P2PMatch]:
        return self.index.p2p_of.get(view.group.id, [])

    def p2p_on(self, view: GroupView, src: int, dst: int) -> list[P2PMatch]:
        """The group's P2P pairs on the channel from `src` to `dst` (global ranks), in order."""
        channels = self._channels.get(view.group.id)
        if channels is None:
            channels = self._channels[view.group.id] = {}
            for pair in self.p2p_of(view):
                channels.setdefault((pair.src, pair.dst), []).append(pair)
        return channels.get((src, dst), [])

    def like_rank_went_on(self, view: GroupView, seq: int, rank: int) -> Optional[Entry]:
        """The op `rank` is blocked in, when it is absent from collective `seq` of `view`'s
        group and a like rank (the one in its place in a sibling group that ran #seq) is
        blocked in the same op: the collective of that number in a group of the same
        family as the rank's. That like rank ran #seq, then reached that op; `rank` reached
        it without #seq. None when nothing shows that."""
        blocked = self.blocked_entry.get(rank)
        if blocked is None or blocked.is_p2p or blocked.collective_seq_id is None:
            return None
        place = self.group_of_entry(blocked, rank)
        if place is None or place.group.id == view.group.id:
            return None
        position = view.group.ranks.index(rank)
        family = family_of(place.group)
        siblings = self.siblings_of(view)
        if self._fellows_lack_it_too(view, seq, rank, blocked, place) or self._peers_ran_it_first(view, seq, rank, place):
            return None
        for sibling in siblings.views:
            if position >= len(sibling.group.ranks) or not siblings.ran(sibling, seq):
                continue
            like = sibling.group.ranks[position]
            theirs = self.blocked_entry.get(like)
            if theirs is None or theirs.is_p2p or theirs.collective_seq_id != blocked.collective_seq_id:
                continue
            their_place = self.group_of_entry(theirs, like)
            if their_place is not None and family_of(their_place.group) == family:
                return blocked
        return None

    def _fellows_lack_it_too(self, view: GroupView, seq: int, rank: int, blocked: Entry, place: GroupView) -> bool:
        """Whether another member blocked in the op `rank` is blocked in (`place`'s) never
        issued collective `seq` of its own group of `view`'s family either. Then that op
        comes before #seq in their program (they did not all leave #seq out), and a like
        rank that ran #seq first runs another part of the program (another pipeline
        stage, whose groups of the family are siblings too)."""
        family = family_of(view.group)
        for member in place.group.ranks:
            theirs = self.blocked_entry.get(member)
            if member == rank or theirs is None or theirs.is_p2p or (theirs.pg_name, theirs.collective_seq_id) != (
                    blocked.pg_name, blocked.collective_seq_id):
                continue
            own = self._group_in_family(family, member)
            match = self.index.at.get((own.group.id, seq)) if own is not None else None
            if match is not None and member in match.not_issued:
                return True
        return False

    def _peers_ran_it_first(self, view: GroupView, seq: int, rank: int, place: GroupView) -> bool:
        """Whether the members of `view`'s group waiting in collective `seq` (the rank's own
        part of the program: a group's members run one) each finished, in their own group
        of `place`'s family (that of the op `rank` is blocked in, at `place`), the
        collective of that op's number: that op comes before #seq, and the rank has not
        reached #seq yet."""
        blocked = self.blocked_entry[rank]
        match = self.index.at.get((view.group.id, seq))
        if match is None or blocked.collective_seq_id is None:
            return False
        family = family_of(place.group)
        waiting = [member for member in match.issued if member != rank and member not in match.completed_ranks]
        return bool(waiting) and all(self._finished_in_family(family, member, blocked.collective_seq_id)
                                     for member in waiting)

    def _finished_in_family(self, family: Family, rank: int, seq: int) -> bool:
        """Whether `rank` finished collective `seq` of its group in `family` (its pg_status,
        or its entry of it)."""
        own = self._group_in_family(family, rank)
        stream = own.streams.get(rank) if own is not None else None
        if own is None or stream is None:
            return False
        if stream.finished is not None and stream.finished >= seq:
            return True
        match = self.index.at.get((own.group.id, seq))
        return match is not None and rank in match.completed_ranks

    def _group_in_family(self, family: Family, rank: int) -> Optional[GroupView]:
        """The rank's group in `family`, from a rank -> group map built once per family
        asked about (scanning the family per rank took 0.15 s at 4,096 ranks)."""
        members = self._members_of.get(family)
        if members is None:
            members = self._members_of[family] = {}
            for view in reversed(self._families.get(family, [])):  # the first group holding a rank wins
                members.update(dict.fromkeys(view.group.ranks, view))
        return members.get(rank)

    def like_rank_ran_more_p2p(self, view: GroupView, rank: int) -> Optional[Entry]:
        """The op `rank` is blocked in, when a like rank (the one in its place in a sibling
        group of `view`'s) is blocked in the same op and its pg_status says it finished
        more of its group's work, none pending (up to MAX_P2P_SKIPPED more), than the rank's
        says it finished in `view`'s group: the two ran one program to that op, and the rank
        left some of it out. For dumps of only active entries of a group's sends and recvs:
        their finished ops are left out, and no P2P order of the rank is held. None when
        nothing shows that."""
        blocked = self.blocked_entry.get(rank)
        place = self.group_of_entry(blocked, rank) if blocked is not None else None
        if blocked is None or place is None or blocked.is_p2p:
            return None
        here = place.group.id == view.group.id
        mine = self._work_finished_before(view, rank, blocked if here else None)
        if mine is None:
            return None
        position = view.group.ranks.index(rank)
        family = family_of(place.group)
        for sibling in self.siblings_of(view).views:
            if position >= len(sibling.group.ranks):
                continue
            like = sibling.group.ranks[position]
            theirs = self.blocked_entry.get(like)
            if theirs is None or (theirs.is_p2p, theirs.op, theirs.collective_seq_id) != (
                    blocked.is_p2p, blocked.op, blocked.collective_seq_id):
                continue
            their_place = self.group_of_entry(theirs, like)
            their_work = self._work_finished_before(sibling, like, theirs if here else None)
            if (their_place is not None and family_of(their_place.group) == family and their_work is not None
                    and 0 < their_work - mine <= MAX_P2P_SKIPPED):
                return blocked
        return None

    def like_rank_posted_more_p2p(self, view: GroupView, rank: int) -> Optional[LikeRankAhead]:
        """Where `rank` is blocked in a send or recv of `view`'s group, waiting on one peer:
        a like rank (in its place in a sibling group) blocked in the same op with a higher
        P2P number (up to MAX_P2P_SKIPPED higher), whose peer (in the place of the rank's)
        is blocked in the same op of the same number as the rank's peer. The two peers
        posted the same ops, so the like rank's op of the rank's number was fed as the
        rank's would be: the rank's numbering fell behind by ops it left out (or the like
        rank added; with one sibling the dumps cannot say which). None when nothing shows
        that."""
        blocked = self.blocked_entry.get(rank)
        peers = self.waits.on.get(rank, frozenset())
        if blocked is None or not blocked.is_p2p or blocked.p2p_seq_id is None or len(peers) != 1:
            return None
        (peer,) = peers
        peer_blocked = self.blocked_entry.get(peer)
        members = view.group.ranks
        if (peer_blocked is None or not peer_blocked.is_p2p or peer not in members or rank not in members
                or not self._in_group(blocked, rank, view) or not self._in_group(peer_blocked, peer, view)):
            return None
        for sibling, (like, like_peer) in self.like_ranks_in_siblings(view, (rank, peer)):
            theirs, their_peer = self.blocked_entry.get(like), self.blocked_entry.get(like_peer)
            if (theirs is None or their_peer is None or not theirs.is_p2p or theirs.op != blocked.op
                    or theirs.p2p_seq_id is None or (their_peer.op, their_peer.p2p_seq_id) != (
                        peer_blocked.op, peer_blocked.p2p_seq_id)
                    or not self._in_group(theirs, like, sibling) or not self._in_group(their_peer, like_peer, sibling)):
                continue
            ahead = theirs.p2p_seq_id - blocked.p2p_seq_id
            if 0 < ahead <= MAX_P2P_SKIPPED:
                return LikeRankAhead(rank, op_text(blocked), like, group_text(sibling.group.name, sibling.group.desc), ahead)
        return None

    def like_partner_posted(self, view: GroupView, holder: int, absent: int, number: int) -> Optional[LikePartnerPosted]:
        """Where `absent` never posted the partner of `holder`'s send or recv #`number` in
        `view`'s group (a group of sends and recvs only): a like rank of the holder (in its
        place in a sibling group) finished its op of that number, by its pg_status there,
        while the like rank of `absent` is blocked in the very op `absent` is blocked in, of
        the same number. That like rank posted the partner, so `absent`, standing where it
        does, posted it too: the holder's op is what never finished. None when nothing
        shows that."""
        blocked = self.blocked_entry.get(absent)
        members = view.group.ranks
        if (blocked is None or not blocked.is_p2p or blocked.p2p_seq_id is None or holder not in members
                or absent not in members or not self._in_group(blocked, absent, view) or self.collectives_of(view)):
            return None
        for sibling, (like, like_absent) in self.like_ranks_in_siblings(view, (holder, absent)):
            theirs = self.blocked_entry.get(like_absent)
            if (self.collectives_of(sibling) or theirs is None or (theirs.is_p2p, theirs.op, theirs.p2p_seq_id) != (True, blocked.op, blocked.p2p_seq_id)
                    or not self._in_group(theirs, like_absent, sibling)):
                continue
            finished = self._p2p_work_finished(sibling, like)
            if finished is not None and finished >= number:
                return LikePartnerPosted(like, like_absent, group_text(sibling.group.name, sibling.group.desc))
        return None

    def partner_went_on_as_like_rank(self, view: GroupView, holder: int, absent: int,
                                     number: int) -> Optional[LikePartnerPosted]:
        """Where `absent` holds no partner of `holder`'s send or recv #`number` in `view`'s
        group, in whole dumps: `absent` went on to a collective of another group and is
        blocked in it, the rank in its place in a sibling group is blocked in that
        collective too (the same op, the same number), both posted the same number of
        sends and recvs in their groups, and the holder's like rank there finished its op
        of that number. `absent` left nothing out that its like rank posted, so it posted
        the partner and went on: the holder's op is what never finished, as a GPU that
        stopped completing work leaves it. None when that is not shown."""
        blocked, mine = self.blocked_entry.get(absent), view.streams.get(absent)
        members = view.group.ranks
        if (blocked is None or blocked.is_p2p or self._in_group(blocked, absent, view) or mine is None
                or mine.only_active or not len(mine.p2p) or holder not in members or absent not in members
                or not self._waits_in(blocked, absent, holder)):
            return None
        for sibling, (like, like_absent) in self.like_ranks_in_siblings(view, (holder, absent)):
            theirs = self._newest_p2p_gone_on_alike(sibling, like_absent, blocked)
            if theirs is None or theirs != _newest_p2p(mine) or not self._waits_in(self.blocked_entry[like_absent], like_absent):
                continue
            if self._finished_p2p_number(sibling, like, number):
                return LikePartnerPosted(like, like_absent, group_text(sibling.group.name, sibling.group.desc))
        return None

    def posted_fewer_than_like_rank(self, view: GroupView, rank: int) -> bool:
        """Whether `rank`, in whole dumps, went on to a collective of another group having
        posted fewer sends and recvs in `view`'s group (its newest P2P number there is
        lower) than the rank in its place in a sibling group, which waits in that same
        collective: it left out a send or recv its like rank posted."""
        went_on, mine = self.blocked_entry.get(rank), view.streams.get(rank)
        if (went_on is None or went_on.is_p2p or mine is None or mine.only_active or not len(mine.p2p)
                or rank not in view.group.ranks):
            return False
        newest = _newest_p2p(mine)
        for sibling, (like,) in self.like_ranks_in_siblings(view, (rank,)):
            theirs = self._newest_p2p_gone_on_alike(sibling, like, went_on)
            if (isinstance(newest, int) and isinstance(theirs, int) and newest < theirs
                    and not sibling.streams[like].only_active):
                return True
        return False

    def _newest_p2p_gone_on_alike(self, sibling: GroupView, like: int, went_on: Entry) -> Optional[int]:
        """The newest P2P number of `like` in `sibling` where it holds sends or recvs there
        and is blocked in the collective `went_on` is (the same op of the same number in a
        group described alike); None otherwise."""
        theirs, their_stream = self.blocked_entry.get(like), sibling.streams.get(like)
        if (theirs is None or their_stream is None or not len(their_stream.p2p)
                or (theirs.is_p2p, theirs.op, theirs.pg_desc, theirs.collective_seq_id)
                != (False, went_on.op, went_on.pg_desc, went_on.collective_seq_id)):
            return None
        return _newest_p2p(their_stream)

    def like_ops_unfinished(self, view: GroupView, holder: int, absent: int, sends: bool,
                            number: int) -> list[str]:
        """The names of the sibling groups where the rank in `holder`'s place holds the like
        op unfinished: its send (`sends`) or recv #`number` on the channel to or from the
        rank in the place of `absent` (a member without a dump), which has a dump there
        and either posted the partner, unfinished too, or did not. Empty unless every
        sibling group read (MAX_SIBLINGS_ASKED at most) shows that, and there is one:
        those groups stand where this one does without a missing dump, so the missing
        dump explains nothing."""
        if not self.reliable or holder not in view.group.ranks or absent not in view.group.ranks:
            return []
        names = []
        for sibling, (like_holder, like_absent) in self.like_ranks_in_siblings(view, (holder, absent)):
            if like_absent in sibling.no_dump:
                return []
            src, dst = (like_holder, like_absent) if sends else (like_absent, like_holder)
            if not any(_unfinished_like(pair, sends, number) for pair in self.p2p_on(sibling, src, dst)):
                return []
            names.append(sibling.group.name)
        return names

    def _waits_in(self, entry: Entry, rank: int, for_rank: Optional[int] = None) -> bool:
        """Whether the rank waits in its collective `entry` for others: no member finished
        it, and `for_rank`, where given, is a member that never issued it. (A rank holding
        an op a peer finished has a GPU that stopped there, and members all in an op may
        have stopped in it together: where such a rank stands says nothing of what it
        posted.)"""
        group_id = self.analysis.layout.group_of(entry.pg_name, rank)
        match = self.index.at.get((group_id, entry.collective_seq_id)) if group_id is not None else None
        return (match is not None and not match.completed_ranks
                and (for_rank is None or for_rank in match.not_issued))

    @staticmethod
    def _finished_p2p_number(view: GroupView, rank: int, number: int) -> bool:
        """Whether the rank's dump holds its send or recv #`number` of the group, finished."""
        stream = view.streams.get(rank)
        if stream is None:
            return False
        numbers = stream.p2p.field("p2p_seq_id")
        return any(stream.p2p[at].completed for at, seq in enumerate(numbers) if seq == number)

    def like_ranks_in_siblings(self, view: GroupView, ranks: tuple[int, ...]) -> Iterator[tuple[GroupView, tuple[int, ...]]]:
        """(sibling group, the ranks in the places of `ranks` there) for up to
        MAX_SIBLINGS_ASKED sibling groups of `view`'s that have those places."""
        positions = [view.group.ranks.index(rank) for rank in ranks]
        for sibling in self.siblings_of(view).views[:MAX_SIBLINGS_ASKED]:
            members = sibling.group.ranks
            if max(positions) < len(members):
                yield sibling, tuple(members[position] for position in positions)

    def _p2p_work_finished(self, view: GroupView, rank: int) -> Optional[int]:
        """The number of the last send or recv the rank finished in a group of sends and
        recvs only, by its pg_status (which counts a group's works, P2P ones by their P2P
        number); None where unknown, or where the rank is blocked in the group's op of that
        number or an earlier one."""
        status = self._pg_status(view, rank)
        if status is None or status.last_completed is None:
            return None
        blocked = self.blocked_entry.get(rank)
        if (blocked is not None and blocked.is_p2p and blocked.p2p_seq_id is not None
                and blocked.p2p_seq_id <= status.last_completed and self._in_group(blocked, rank, view)):
            return None
        return status.last_completed

    def _work_finished_before(self, view: GroupView, rank: int, pending: Optional[Entry]) -> Optional[int]:
        """The number of the last work the rank finished in the group, by its pg_status,
        where it enqueued nothing after it, or only the collective `pending` (the op it is
        blocked in, of this group); None where that does not hold or is unknown."""
        status = self._pg_status(view, rank)
        if status is None or status.last_completed is None:
            return None
        enqueued = status.last_completed if pending is None else pending.collective_seq_id
        return status.last_completed if status.last_enqueued == enqueued else None

    def _pg_status(self, view: GroupView, rank: int) -> Optional[PgStatus]:
        """The rank's pg_status entry for `view`'s group (under its own pg_id), if dumped."""
        stream = view.streams.get(rank)
        dump = self._dumps.get(rank)
        if stream is None or stream.pg_id is None or dump is None:
            return None
        return dump.pg_status.get(stream.pg_id)

    def whole_dump_of(self, rank: int) -> Optional[RankDump]:
        """The rank's dump as written, if it left one: with the ops it queued behind the
        one it waits in, which the device view leaves out."""
        if self._whole_dumps_by_rank is None:
            self._whole_dumps_by_rank = {dump.rank: dump for dump in self.analysis.dumps}
        return self._whole_dumps_by_rank.get(rank)

    @property
    def _dumps(self) -> dict[int, RankDump]:
        if self._dumps_by_rank is None:
            self._dumps_by_rank = {dump.rank: dump for dump in self.seen}
        return self._dumps_by_rank

    def queued_at(self, view: GroupView, seq: int, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """Those of `ranks` that the device view shows without collective `seq` of the
        group although their whole dumps hold an entry of that number: queued behind the
        op they are blocked in (the device view leaves such ops out)."""
        dumped = self.analysis.matches
        if dumped is self.device:
            return ()
        match = dumped.index.at.get((view.group.id, seq))
        return tuple(rank for rank in ranks if rank in match.calls) if match is not None else ()

    def _in_group(self, entry: Entry, rank: int, view: GroupView) -> bool:
        return self.analysis.layout.group_of(entry.pg_name, rank) == view.group.id

    def group_of_entry(self, entry: Entry, rank: int) -> Optional[GroupView]:
        """The device view of the group the rank recorded `entry` under."""
        gid = self.analysis.layout.group_of(entry.pg_name, rank)
        return self.device.views[gid] if gid is not None else None

    def siblings_of(self, view: GroupView) -> Siblings:
        # The family is read only when asked (a group with something to weigh): listing
        # it for every group would cost groups x family size.
        family = self._families.get(family_of(view.group), [])
        return Siblings(family, view.group.id, self.index, self._step_memo)


def _first_divergence(matches: list[CollectiveMatch], reliable: bool,
                      behind: Callable[[CollectiveMatch], bool]) -> Optional[int]:
    """Index of the first of `matches` its members disagree on, or that some never issued
    (not counting members only `behind` on the device: `_BehindOnDevice`); None if none."""
    for index, match in enumerate(matches):
        if match.disagreement is not None:
            return index
        if match.not_issued and not took_part_unrecorded(match, reliable) and not behind(match):
            return index
    return None


class _BehindOnDevice:
    """Whether the members a collective's device-view match lacks are only behind on the
    device, not in their programs: each holds the op, alike, queued in its whole dump,
    behind a collective it is blocked in and that some other member of that collective
    finished. That member could not have finished it without them, so their part of it
    is done; their dumps show it unfinished because they were taken before it ended on
    their side, or because their GPU stopped there (a device stall,
    `frontier.stuck_on_device`'s question). Either way their programs agree; read so only
    where they outnumber the ranks that finished those ops (a stall of fewer GPUs than
    ranks dumped a moment later stays the divergence it looks like on the device)."""

    def __init__(self, analysis: Analysis, blocked: dict[int, Entry]) -> None:
        self.whole = analysis.matches.index
        self.device = analysis.device.index
        self.layout = analysis.layout
        self.blocked = blocked
        self.queued_anything = analysis.matches is not analysis.device

    def __call__(self, match: CollectiveMatch) -> bool:
        if not self.queued_anything:
            return False
        held = self.whole.at.get((match.group_id, match.seq))
        if held is None or held.disagreement is not None:
            return False
        finishers: set[int] = set()
        for rank in match.not_issued:
            finished = self._finished_by_others(match.group_id, match.seq, rank) if rank in held.calls else ()
            if not finished:
                return False
            finishers.update(finished)
        return len(match.not_issued) > len(finishers)

    def _finished_by_others(self, group_id: int, seq: int, rank: int) -> tuple[int, ...]:
        """The other members that finished the collective `rank` is blocked in (none when
        it is blocked in no collective, or in this group's op `seq` or a later one)."""
        entry = self.blocked.get(rank)
        if entry is None or entry.is_p2p:
            return ()
        blocked_group = self.layout.group_of(entry.pg_name, rank)
        if blocked_group is None or (blocked_group == group_id and entry.collective_seq_id >= seq):
            return ()
        there = self.device.at.get((blocked_group, entry.collective_seq_id))
        if there is None or rank not in there.calls:
            return ()
        return tuple(r for r in there.completed_ranks if r != rank)


def unfinished(matches: list[CollectiveMatch]) -> Iterator[CollectiveMatch]:
    """The matches, in their order, that some rank which issued them has not completed
    (`CollectiveMatch.unfinished`, which the matcher sets): picked out in C, as most of a
    group's thousands of matches are finished."""
    return compress(matches, map(_UNFINISHED, matches))


_UNFINISHED = attrgetter("unfinished")


def took_part_unrecorded(match: CollectiveMatch, reliable: bool) -> bool:
    """Every member that issued the op completed it, which a collective cannot do
    without the rest of its members: the ones with no entry for it took part, their
    dump just does not show it (dumped without collectives, or only active ops)."""
    return reliable and bool(match.calls) and len(match.completed_ranks) == len(match.calls)


def _newest_p2p(stream: RankStream) -> int:
    """The P2P number of the rank's newest send or recv in the group (it holds one)."""
    newest: int = stream.p2p[len(stream.p2p) - 1].p2p_seq_id
    return newest


def new_finding(kind: str, rule: str, view: Optional[GroupView], *, suspect_ranks: tuple[int, ...],
                message: str, evidence: Optional[dict[str, Any]] = None, severity: Optional[str] = None,
                **fields: Any) -> Finding:
    """A finding about `view`'s group (None: about the job), with its kind's severity
    unless the rule says otherwise."""
    group = view.group if view else None
    return Finding(
        kind=kind, rule=rule, own_severity=severity or kind_row(kind).severity,
        group_id=group.id if group else None, pg_name=group.name if group else "",
        pg_desc=group.desc if group else "", own_suspects=tuple(suspect_ranks), statement=message,
        facts=evidence if evidence is not None else {}, **fields,
    )


def last_entry(view: GroupView, rank: int) -> Optional[Entry]:
    """The rank's newest collective entry in the group."""
    stream = view.streams.get(rank)
    if stream is None or not stream.collectives or stream.last_seq is None:
        return None
    return stream.collectives[stream.last_seq][-1]


def oldest_created(match: CollectiveMatch) -> int:
    oldest: int = min(match.calls.first_values("time_created_ns"))
    return oldest
