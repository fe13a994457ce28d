"""A P2P op a rank left out: its sends and recvs in a group, op by op, against the ranks
at its place in the sibling groups.

Takes a rank's P2P ops in one group and its like ranks' (`P2POp`s: `program.newest_p2p_ops`);
returns `LeftOut` when the rank's ops are theirs (who agree among themselves) but for one
it left out, after which it went on as they did. The tests that follow a channel alone
cannot see such a skip: after a send left out early, each of the rank's later sends on
the channel pairs one step off, so the op its partner waits in has a match on the rank
too, and the pair the skip shifted may hold nothing after it to line up.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

from frtrace.diagnosis.program import LIKENESS_WINDOW, Channel, P2POp
from frtrace.match.matcher import GroupView

LIKE_CHANNEL_RANKS = 8  # like ranks whose sends and recvs are compared with a rank's, at most
MIN_OPS_IN_STEP = 2  # ops a rank must share with its like ranks before the one it left out


class LeftOut(NamedTuple):
    """The op a rank left out, and what it issued in its place."""

    channel: Channel  # of the op left out
    went_on: P2POp  # the rank's op where its like ranks posted the one left out
    like_ranks: int  # how many like ranks agree on it


def like_members(family: Sequence[GroupView], group: GroupView, rank: int) -> list[tuple[GroupView, int]]:
    """(group, rank) of the ranks at the rank's place in the other groups of `family`
    (at most LIKE_CHANNEL_RANKS)."""
    local = group.group.ranks.index(rank)
    found = []
    for sibling in family:
        ranks = sibling.group.ranks
        if sibling.group.id != group.group.id and local < len(ranks):
            found.append((sibling, ranks[local]))
            if len(found) == LIKE_CHANNEL_RANKS:
                break
    return found


def left_out(mine: list[P2POp], likes: list[list[P2POp]]) -> Optional[LeftOut]:
    """The op the rank left out where its like ranks posted it (see module docstring);
    None where its ops are theirs, a part of theirs (it has not got so far), or differ
    otherwise, or where the like ranks disagree."""
    likes = [ops for ops in likes if ops]
    if not mine or not likes:
        return None
    # Start where every one of them holds whole batches: a wrapped buffer may keep only
    # the end of its oldest batch.
    start = max(ops[0].seq for ops in (mine, *likes)) + 1
    mine, likes = _from_seq(mine, start), [_from_seq(ops, start) for ops in likes]
    reference = max(likes, key=len)  # the one that got furthest
    if not all(_channels(ops) == _channels(reference[:len(ops)]) for ops in likes):
        return None  # the like ranks differ among themselves: no one program to compare with
    at = _first_difference(mine, reference)
    if at is None or at < MIN_OPS_IN_STEP:
        return None
    after = min(LIKENESS_WINDOW, len(mine) - at, len(reference) - at - 1)
    if after < 1 or _channels(mine[at:at + after]) != _channels(reference[at + 1:at + 1 + after]):
        return None
    return LeftOut(reference[at].channel, mine[at], len(likes))


def _from_seq(ops: list[P2POp], start: int) -> list[P2POp]:
    return [op for op in ops if op.seq >= start]


def _channels(ops: list[P2POp]) -> list[Channel]:
    return [op.channel for op in ops]


def _first_difference(mine: list[P2POp], reference: list[P2POp]) -> Optional[int]:
    """Where the rank's ops first differ from its like ranks' (number or channel); None
    where one list runs out first."""
    for at, (own, theirs) in enumerate(zip(mine, reference)):
        if (own.seq, own.channel) != (theirs.seq, theirs.channel):
            return at
    return None
