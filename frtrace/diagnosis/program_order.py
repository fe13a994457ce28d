"""Program order: whether a rank absent from an op went past it or has not got there.

Takes the device view's dumps, layout and matches (through `ProgramOrder`) and a
finding; returns, per absent rank, `WentPast` evidence when the rank skipped the op.

A rank that is absent from an op because it waits in another group's op is either a
victim (in its program that other op comes first) or went past the op (it skipped it,
and blocks further on: a deadlock it caused). Sequence numbers cannot tell these apart
across groups; the order in which ranks that play the same part issued their ops can.
Four modules answer, one question each:

    program.py        reading one rank's program: positions, batches, the `Token` of an op
    like_ranks.py     comparing the rank with the ranks that play the same part
    like_channels.py  a P2P op the rank left out where those ranks posted it, op by op
    own_past.py       with no like rank to decide, the rank's own past (its earlier steps)
"""

from __future__ import annotations

from typing import Optional

from frtrace.diagnosis.finding import Finding, WentPast
from frtrace.diagnosis.like_ranks import (
    SiblingWitnesses,
    Witnessed,
    Witnesses,
    collective_witnesses,
    like_channels_say_skipped,
    like_ranks_say_skipped,
    p2p_witnesses,
    peers_in_its_op_say_skipped,
    places,
)
from frtrace.diagnosis.own_past import (
    HISTORY_RANKS,
    channel_positions,
    finding_turns_say_skipped,
    neighbours_say_skipped,
    past_says_skipped,
    unposted_channel,
)
from frtrace.diagnosis.program import OpForm, Programs, Token
from frtrace.load.layout import Layout
from frtrace.match.matcher import MatchResult
from frtrace.table.rank_dump import RankDump


class ProgramOrder:
    """Every rank's program (`Programs`) and what the ranks in sibling groups posted,
    both kept across the findings of one diagnosis."""

    def __init__(self, dumps: list[RankDump], layout: Layout, matches: MatchResult):
        self.program = Programs(dumps, layout, matches)
        self.siblings = SiblingWitnesses(self.program)


def went_past_finding(order: ProgramOrder, finding: Finding, ranks: tuple[int, ...]) -> dict[int, WentPast]:
    """rank -> WentPast for those of `ranks` (absent from the finding, waiting
    elsewhere) that went past its op. Ranks no like rank could judge are compared with
    their own past: a rank no like rank plays the part of, as a whole; one whose like
    ranks split (as many chose one way as the other), only by the stricter tests (op by
    op, or turns on P2P channels)."""
    program = order.program
    witnessed = _witnesses(order, finding)
    if witnessed is None:
        return _like_channels_say(program, finding, ranks, {})
    op_token, witnesses = witnessed
    befores = _ops_before_in_group(program, finding, witnesses)
    before = _one_collective(befores)
    absent = tuple(r for r in ranks
                   if r in program.entries and not (before is not None and _behind_own_group(program, before, r)))
    judged = _not_behind_own_group(program, befores, absent)
    found, placed = _like_ranks_say(program, judged, op_token, witnesses)
    found = _like_channels_say(program, finding, ranks, found)
    unplaced = [r for r in absent if r not in placed and r not in found]
    split = [r for r in absent if r in placed and r not in found]
    # Every op on a P2P channel is like the one never posted; collectives vary.
    op_form = None if finding.kind == "p2p_unmatched" or op_token is None else op_token.form
    # Like ranks that cannot decide (none placed, or split): the members of the op the
    # rank waits in may still show where the op comes; then its own past.
    for rank in unplaced + split:
        if op_token is not None:
            _add(found, rank, peers_in_its_op_say_skipped(program, rank, op_token))
    # A rank in an op its whole group is in, unfinished everywhere, has not gone past
    # anything: what comes after that op in its program is still to come. Its own past
    # (a few steps in a ring buffer, another phase of a pipeline schedule) is not read.
    unplaced = [r for r in unplaced if not program.in_flight_with_its_group(r)]
    split = [r for r in split if not program.in_flight_with_its_group(r)]
    for rank in _at_most_history_ranks([r for r in unplaced if r not in found]):
        _add(found, rank, _whole_past_says_skipped(program, finding, rank, op_form))
    for rank in _at_most_history_ranks([r for r in split if r not in found]):
        _add(found, rank, _strict_past_says_skipped(program, finding, rank, op_form))
    return found


def _ops_before_in_group(program: Programs, finding: Finding, witnesses: Witnesses) -> Optional[list[Optional[Token]]]:
    """The Token of the op each member of the finding's group that issued its op (those
    read as witnesses) issued right before it (None where its dump does not say); None
    when the finding has no group."""
    group = program.views.get(finding.group_id) if finding.group_id is not None else None
    if group is None:
        return None
    members = set(group.group.ranks)
    befores: list[Optional[Token]] = []
    for rank, entry in witnesses:
        if rank in members:
            position = program.position(rank, entry)
            before = program.previous(rank, position) if position is not None else None
            befores.append(program.token(rank, before) if before is not None else None)
    return befores


def _one_collective(befores: Optional[list[Optional[Token]]]) -> Optional[Token]:
    """The op before, where every member read issued the same collective before the op;
    None otherwise (a send or recv: members of a pipeline group play different parts, and
    a rank's P2P numbers are its own)."""
    token = befores[0] if befores and len(set(befores)) == 1 else None
    return token if token is not None and not token.is_p2p else None


def _behind_own_group(program: Programs, before: Token, rank: int) -> bool:
    """Whether the rank has not reached `before`, the collective its group's members
    issued right before the op (`_one_collective`): its own group of that family never
    got to its number on its device, or it waits in it. It has not got to where its
    group's programs hold the op, so it is behind it, whatever its own past looks like (an
    MoE step runs more all_to_alls between two TP collectives in its backward pass than in
    its forward, which a rank's past alone reads as a skip)."""
    position = program.find(rank, before)
    if position is not None:
        return program.following(rank, position) is None
    newest = program.newest_collective(rank, before.family)
    return newest is not None and newest < before.seq


def _not_behind_own_group(program: Programs, befores: Optional[list[Optional[Token]]],
                          absent: tuple[int, ...]) -> tuple[int, ...]:
    """Those of `absent` that issued the op just before the finding's op in the program of
    every member of its group that issued it (`befores`). The ranks in sibling groups say
    where the op comes in theirs, which may be another program (the TP groups of other
    pipeline stages): a rank that has not reached the place its own group's members issued
    the op at is behind, however like those ranks its last ops look."""
    if befores is None:
        return absent
    known = [token for token in befores if token is not None]
    return tuple(r for r in absent if all(program.find(r, token) is not None for token in known))


def _like_ranks_say(program: Programs, absent: tuple[int, ...], op_token: Optional[Token],
                    witnesses: Witnesses) -> tuple[dict[int, WentPast], set[int]]:
    """like_ranks_say_skipped over the witnesses that issued the op as `op_token` names it."""
    if op_token is None:
        return {}, set()
    witnesses = [(r, e) for r, e in witnesses if program.token_of(r, e) == op_token]
    at = places(program, witnesses, absent)
    return like_ranks_say_skipped(program, absent, op_token, at) if at and absent else ({}, set())


def _like_channels_say(program: Programs, finding: Finding, ranks: tuple[int, ...],
                       found: dict[int, WentPast]) -> dict[int, WentPast]:
    """`found`, plus the ranks of a P2P finding that left its op out where their like ranks
    posted it and went on (like_channels_say_skipped): ranks of dumps of only active
    entries too, whose batches show their P2P order."""
    if finding.kind == "p2p_unmatched" and finding.group_id is not None and finding.anchor is not None:
        for rank in _at_most_history_ranks([r for r in ranks if r not in found]):
            _add(found, rank, like_channels_say_skipped(program, finding.group_id, rank, unposted_channel(finding)))
    return found


def _at_most_history_ranks(ranks: list[int]) -> list[int]:
    """Ranks to read the own past of: none when more than HISTORY_RANKS ask (each reads
    hundreds of ops)."""
    return ranks if len(ranks) <= HISTORY_RANKS else []


def _witnesses(order: ProgramOrder, finding: Finding) -> Optional[Witnessed]:
    """The token of the finding's op and who issued it; None when the finding is about
    no op to compare (or, for a collective, its token is unknown)."""
    if finding.kind == "p2p_unmatched":
        return p2p_witnesses(order.program, order.siblings, finding) if finding.anchor is not None else None
    if finding.collective_seq_id is None or finding.group_id is None:
        return None
    witnessed = collective_witnesses(order.program, finding)
    return witnessed if witnessed[0] is not None else None


def _whole_past_says_skipped(program: Programs, finding: Finding, rank: int,
                             op_form: Optional[OpForm]) -> Optional[WentPast]:
    """A rank no like rank plays the part of: its own past, stretch by stretch, then by
    the stricter tests."""
    channel = channel_positions(program, finding, rank)
    past = past_says_skipped(program, rank, channel, op_form)
    if past is None and finding.kind == "p2p_unmatched":
        past = finding_turns_say_skipped(program, finding, rank)
    elif past is None:
        past = neighbours_say_skipped(program, rank, channel, op_form)
    return past


def _strict_past_says_skipped(program: Programs, finding: Finding, rank: int,
                              op_form: Optional[OpForm]) -> Optional[WentPast]:
    """A rank whose like ranks split: only turns on a P2P channel, or its past op by op."""
    if finding.kind == "p2p_unmatched":
        return finding_turns_say_skipped(program, finding, rank)
    channel = channel_positions(program, finding, rank)
    return neighbours_say_skipped(program, rank, channel, op_form) or past_says_skipped(program, rank, channel, op_form)


def _add(found: dict[int, WentPast], rank: int, past: Optional[WentPast]) -> None:
    if past is not None:
        found[rank] = past


__all__ = ["ProgramOrder", "Token", "went_past_finding"]
