"""Comparing ranks that play the same part: whether a rank absent from an op went past it.

Takes `Programs` (program.py), the token of the op a finding is about and the ranks
that issued it (its witnesses); returns, per absent rank, `WentPast` evidence when the
ranks like it issued the op where it issued something else. Ranks play the same part
when their last few ops (LIKENESS_WINDOW tokens: group family, sequence number, op,
group-local P2P ends and signature) are the same.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import islice
from typing import Optional

from frtrace.diagnosis.finding import Finding, WentPast
from frtrace.diagnosis.like_channels import left_out_at
from frtrace.diagnosis.program import Channel, Programs, Token, Window
from frtrace.match.matcher import CollectiveMatch
from frtrace.model import Entry

MAX_WITNESSES = 64  # ranks that issued an op, consulted on where it comes in the program
MAX_PROFILES = 4  # distinct places in the program the witnesses may come from

Witnesses = list[tuple[int, Entry]]  # (rank, its entry of the op)
Witnessed = tuple[Optional[Token], Witnesses]  # the op's token (None: unknown), and who issued it


@dataclass(slots=True)
class WitnessPlace:
    """Where one witness issued the op: its own op just before, and its ops leading there."""

    rank: int
    position: int  # of the op in the witness's entries
    before: Token  # token of the op just before it
    window: Window  # tokens of the LIKENESS_WINDOW ops ending with `before`


Place = list[WitnessPlace]  # witnesses that issued the op at one place in the program
Choice = tuple[Place, Optional[int]]  # a place, and the position of what a rank issued there
Option = tuple[Place, int, Token]  # a place, and the position and token of what a rank issued there


# ---- who issued the op

def collective_witnesses(program: Programs, finding: Finding) -> Witnessed:
    """(token, [(rank, entry)]) of the op a collective finding is about, as issued by
    the ranks waiting in it and by the members of its sibling groups."""
    gid, seq = finding.group_id, finding.collective_seq_id
    match = program.collectives.get((gid, seq)) if gid is not None and seq is not None else None
    issuer = next((r for r in finding.waiting_ranks if match and r in match.calls), None)
    if issuer is None or match is None or gid is None or seq is None:
        return None, []
    op_token = program.token_of(issuer, match.calls[issuer][0])
    if op_token is None:
        return None, []
    near = finding.absent_ranks[0]
    # Only the entries of the ranks consulted are read: a large group's finding would
    # otherwise build every member's entry to keep MAX_WITNESSES of them.
    nearest = sorted(match.calls, key=lambda r: (abs(r - near), r))[:MAX_WITNESSES]
    witnesses = [(r, match.calls[r][0]) for r in nearest]
    return op_token, _with_sibling_calls(program, witnesses, gid, seq)


def _with_sibling_calls(program: Programs, witnesses: Witnesses, gid: int, seq: int) -> Witnesses:
    """`witnesses`, then the callers of op `seq` in the sibling groups of `gid`, until
    there are MAX_WITNESSES (no more)."""
    for sibling in program.members[program.family[gid]]:
        if len(witnesses) >= MAX_WITNESSES:
            break
        other: Optional[CollectiveMatch] = program.collectives.get((sibling, seq)) if sibling != gid else None
        if other is not None:
            callers = sorted(other.calls)[:MAX_WITNESSES - len(witnesses)]
            witnesses.extend((r, other.calls[r][0]) for r in callers)
    return witnesses


def p2p_witnesses(program: Programs, siblings: SiblingWitnesses, finding: Finding) -> Witnessed:
    """(token, [(rank, entry)]) of the send or recv a P2P finding says was never posted,
    as posted by the ranks that play the absent rank's part in sibling groups."""
    ends = finding.p2p_ends
    view = program.views.get(finding.group_id) if finding.group_id is not None else None
    if ends is None or finding.anchor is None or view is None or not {ends.posted_by, ends.missing_on} <= set(view.group.ranks):
        return None, []  # an end outside the group (a stray rank, `recv ?`): no part to compare
    held = program.token_of(ends.posted_by, finding.anchor)
    if held is None:
        return None, []
    ranks = view.group.ranks
    # The held op's own channel: a batch's token names its first op, which in a pipeline's
    # batch may face the other neighbour.
    anchor = finding.anchor.name
    channel = (anchor.op, anchor.local_src, anchor.local_dst)
    return siblings.witnesses(view.group.id, ranks.index(ends.posted_by), ranks.index(ends.missing_on), held, channel)


class SiblingWitnesses:
    """What the ranks that play a P2P op's absent part in sibling groups posted. Kept:
    the findings of a job-wide hang (one per pipeline channel) ask alike, and all but
    those of the family's first groups read the same siblings."""

    def __init__(self, program: Programs):
        self.program = program
        self._parts: dict[tuple[int, int, int, Token, Channel], Optional[tuple[int, Entry, Token]]] = {}
        self._witnessed: dict[tuple[object, ...], Witnessed] = {}

    def witnesses(self, group_id: int, local_holder: int, local_absent: int, held: Token,
                  channel: Channel) -> Witnessed:
        """(token, [(rank, entry)]) of what the ranks at `local_absent` in the sibling groups of
        `group_id` posted as partner of the op on `channel` (op, local src, local dst) of the
        batch `held` names at `local_holder`, the token most of them posted."""
        program = self.program
        siblings = program.members[program.family[group_id]]
        # Bounded like the witnesses: one finding per pipeline channel must not visit every
        # sibling channel of a large job (that is quadratic in ranks).
        own = group_id if group_id in siblings[:MAX_WITNESSES] else None  # else the first ones are read
        key = (program.family[group_id], own, local_holder, local_absent, held, channel)
        found = self._witnessed.get(key)
        if found is None:
            found = self._witnessed[key] = self._read(group_id, siblings, local_holder, local_absent, held, channel)
        return found

    def _read(self, group_id: int, siblings: list[int], local_holder: int, local_absent: int,
              held: Token, channel: Channel) -> Witnessed:
        witnesses: Witnesses = []
        tokens: dict[Token, int] = defaultdict(int)
        for sibling in islice((g for g in siblings if g != group_id), MAX_WITNESSES):
            part = self.part(sibling, local_holder, local_absent, held, channel)
            if part is not None:
                their_absent, partner, token = part
                witnesses.append((their_absent, partner))
                tokens[token] += 1
        if not tokens:
            return None, []
        return max(tokens.items(), key=lambda kv: kv[1])[0], witnesses

    def part(self, sibling: int, local_holder: int, local_absent: int, held: Token,
             channel: Channel) -> Optional[tuple[int, Entry, Token]]:
        """(rank, entry, token) of what the rank at `local_absent` in group `sibling` posted
        as partner of the op on `channel` of the batch `held` names at `local_holder`; None
        when it did not. A job-wide hang leaves one P2P finding per pipeline channel, and
        each consults the same first siblings of its family: cached, that costs one lookup
        per sibling."""
        key = (sibling, local_holder, local_absent, held, channel)
        if key not in self._parts:
            self._parts[key] = self._part(sibling, local_holder, local_absent, held, channel)
        return self._parts[key]

    def _part(self, sibling: int, local_holder: int, local_absent: int, held: Token,
              channel: Channel) -> Optional[tuple[int, Entry, Token]]:
        program = self.program
        others = program.views[sibling].group.ranks
        if max(local_holder, local_absent) >= len(others):
            return None  # a sibling of another size plays no comparable part
        their_holder, their_absent = others[local_holder], others[local_absent]
        mine = program.find(their_holder, held)
        if mine is not None and channel != (held.op, held.src, held.dst):
            mine = program.op_in_batch(their_holder, mine, channel)
        partner = program.partner(sibling, their_holder, mine) if mine is not None else None
        token = program.token_of(their_absent, partner) if partner is not None else None
        return (their_absent, partner, token) if partner is not None and token is not None else None


# ---- a P2P op left out, the rank's later ops like theirs

def like_channels_say_skipped(program: Programs, group_id: int, rank: int, skipped: Channel) -> Optional[WentPast]:
    """A rank whose sends and recvs in a group are its like ranks' but for one op on the
    `skipped` channel, left out before it went on as they did (like_channels.left_out),
    went past that op."""
    view = program.views.get(group_id)
    if view is None or rank not in view.group.ranks:
        return None
    family = map(program.views.__getitem__, program.members[program.family[group_id]])  # read as far as needed
    found = left_out_at(family, view, rank, lambda group, member, count: program.p2p_ops(group.group.id, member, count))
    if found is None or found.channel != skipped:
        return None
    # Read off the group's stream, not the rank's program: a dump of only active entries
    # holds the rank's P2P order, not its whole one.
    return WentPast(view.streams[rank].p2p[found.went_on], group_id, found.like_ranks, True)


# ---- where the op stands in the program

def places(program: Programs, witnesses: Witnesses, absent: tuple[int, ...]) -> list[Place]:
    """The distinct places (op before, ops leading there) where witnesses issued the
    op, among those some absent rank has reached (the others cannot judge it)."""
    found: dict[tuple[Token, Window], Place] = {}
    reached: dict[Optional[Token], bool] = {}  # token of the op before -> whether an absent rank issued it
    for rank, entry in witnesses[:MAX_WITNESSES]:
        position = program.position(rank, entry)
        before = program.previous(rank, position) if position is not None else None
        if position is None or before is None:
            continue  # the first op kept in its buffer: nothing tells where it stands
        token = program.token(rank, before)
        if token not in reached:
            reached[token] = token is not None and any(program.find(r, token) is not None for r in absent)
        if not reached[token]:
            continue
        window = program.window(rank, before)
        if None in window:
            continue
        assert window[0] is not None  # the token of `before`, which some absent rank issued
        key = (window[0], window)
        if key not in found and len(found) == MAX_PROFILES:
            continue
        found.setdefault(key, []).append(WitnessPlace(rank, position, window[0], window))
    return list(found.values())


def _choices(program: Programs, rank: int, places: list[Place]) -> list[Choice]:
    """[(place, position of what the rank issued there, or None when nothing)] for
    every place the rank shares with the witnesses."""
    choices: list[Choice] = []
    for place in places:
        first = place[0]
        mine = program.find(rank, first.before)
        if mine is not None and program.window(rank, mine) == first.window:
            choices.append((place, program.following(rank, mine)))
    return choices


def _options_instead(program: Programs, rank: int, op_token: Token, choices: list[Choice]) -> Optional[list[Option]]:
    """What the rank issued instead of the op at every place it shares with the
    witnesses; None when at some place it issued the op or nothing yet. (A few ops in
    common may not single out one part of the program: a rank that fits one place
    where it stands before the op has skipped nothing.)"""
    tokens = [program.token(rank, position) if position is not None else None for _, position in choices]
    if not choices or not all(token is not None and token != op_token for token in tokens):
        return None
    return [(place, position, token) for (place, position), token in zip(choices, tokens)
            if token is not None and position is not None]


def like_ranks_say_skipped(program: Programs, absent: tuple[int, ...], op_token: Token,
                           places: list[Place]) -> tuple[dict[int, WentPast], set[int]]:
    """({rank: WentPast} for the absent ranks that reached the place where their
    like ranks issued the op and issued something else there instead, the ranks
    whose like ranks were found at all)."""
    options_of: dict[int, list[Option]] = {}
    placed: set[int] = set()
    for rank in absent:
        choices = _choices(program, rank, places)
        if choices:
            placed.add(rank)
        options = _options_instead(program, rank, op_token, choices)
        if options is not None:
            options_of[rank] = options
    same_choice = _same_choices(options_of)
    found = {}
    for rank, options in options_of.items():
        verdicts = [_verdict(program, place, token, same_choice[(id(place), token)]) for place, _, token in options]
        if all(verdict is not None for verdict in verdicts):
            place, position, _ = options[0]
            found[rank] = program.went_past(rank, position, len(place), any(verdicts))
    return found, placed


def _same_choices(options_of: dict[int, list[Option]]) -> dict[tuple[int, Optional[Token]], int]:
    """How many absent ranks made each choice at each place: a choice most like ranks
    made is the program, not a deviation."""
    same_choice: dict[tuple[int, Optional[Token]], int] = defaultdict(int)
    for options in options_of.values():
        for place, _, token in options:
            same_choice[(id(place), token)] += 1
    return same_choice


def _verdict(program: Programs, place: Place, token: Token, same_choice: int) -> Optional[bool]:
    """Whether issuing `token` where the witnesses at `place` issued the op went
    past it: True when they issue `token` after the op (it skipped the op), False
    when most like ranks issued the op there but nothing shows `token` comes after
    it, None when the witnesses issue `token` before the op or as many like ranks
    chose it (then it is the program, and the rank has not got to the op yet)."""
    after = before = 0
    for witness in place:
        theirs = program.find(witness.rank, token)
        if theirs is not None:
            after += theirs > witness.position
            before += theirs < witness.position
    if after > before:
        return True
    if before or len(place) <= same_choice:
        return None
    return False


# ---- the members of the op the rank waits in

MIN_PEERS_IN_ITS_OP = 2  # members of the op a rank waits in that must show the order


def peers_in_its_op_say_skipped(program: Programs, rank: int, op_token: Token) -> Optional[WentPast]:
    """A rank that waits in a collective B without having issued the collective `op_token`
    names (in its own group of that family): when the other members of B that issued
    both (in their own groups of the op's family) all issued the op before B, B comes
    after the op in the program, and the rank went past the op. Where the like ranks
    cannot be placed (the stages of one pipeline differ in their recent ops), the members
    of B still show the program's order."""
    entries = program.entries.get(rank)
    if op_token.is_p2p or not entries or program.find(rank, op_token) is not None:
        return None
    position = len(entries) - 1  # the device view ends with the op the rank waits in
    waits_in = program.token(rank, position)
    if waits_in is None or waits_in.is_p2p or entries[position].completed:
        return None
    gid = program.group_in_family.get((rank, waits_in.family))
    view = program.views.get(gid) if gid is not None else None
    if view is None:
        return None
    before = after = 0
    for peer in islice((r for r in view.streams if r != rank), MAX_WITNESSES):
        at_op, at_b = program.find(peer, op_token), program.find(peer, waits_in)
        if at_op is not None and at_b is not None:
            before += at_op < at_b
            after += at_op > at_b
    if before < MIN_PEERS_IN_ITS_OP or after:
        return None
    return program.went_past(rank, position, before, True)
