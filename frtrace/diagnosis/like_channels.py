"""A P2P op a rank left out: its sends and recvs in a group, op by op, against the ranks
at its place in the sibling groups.

Takes a rank's P2P ops in one group and its like ranks' (`P2POps`: `program.newest_p2p_ops`;
`left_out_at` reads them, given how); returns `LeftOut` when the rank's ops are theirs (who agree among themselves) but for one
it left out, after which it went on as they did. The tests that follow a channel alone
cannot see such a skip: after a send left out early, each of the rank's later sends on
the channel pairs one step off, so the op its partner waits in has a match on the rank
too, and the pair the skip shifted may hold nothing after it to line up.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, Optional

from frtrace.diagnosis.program import HISTORY_P2P_OPS, LIKE_HISTORY_P2P_OPS, LIKENESS_WINDOW, Channel, P2POps
from frtrace.match.matcher import GroupView

LIKE_CHANNEL_RANKS = 4  # like ranks whose sends and recvs are compared with a rank's, at most
MIN_OPS_IN_STEP = 2  # ops a rank must share with its like ranks before the one it left out
MAX_BATCH_LEFT_OUT = 4  # ops of one batch (a pipeline step's sends and recvs) a rank may have left out


class LeftOut(NamedTuple):
    """The op a rank left out, and the op it issued in its place."""

    channel: Channel  # of the op left out (the first, for a batch)
    went_on_seq: int  # p2p_seq_id of the rank's op where its like ranks posted the one left out
    went_on: int  # that op's place among the rank's P2P ops in the group (RankStream.p2p)
    like_ranks: int  # how many like ranks agree on it
    ops: int = 1  # ops left out: one, or a whole batch's (one P2P number)
    # Left out of the batch the rank waits in, which it posted without them (short_batch):
    # the op it "went on to" is that batch's, which its like ranks post beside them.
    in_batch: bool = False


# Reads a rank's newest P2P ops in a group: (the group, the rank, how many) -> its ops.
OpsOf = Callable[[GroupView, int, int], P2POps]


def left_out_at(family: Iterable[GroupView], group: GroupView, rank: int, ops_of: OpsOf) -> Optional[LeftOut]:
    """left_out of the rank's newest ops in `group` against those of the ranks at its
    place in the other groups of `family` (more of theirs: they may have gone further)."""
    return left_out(ops_of(group, rank, HISTORY_P2P_OPS), _likes(family, group, rank, ops_of))


def _likes(family: Iterable[GroupView], group: GroupView, rank: int, ops_of: OpsOf) -> list[P2POps]:
    return [ops_of(sibling, like, LIKE_HISTORY_P2P_OPS) for sibling, like in _like_members(family, group, rank)]


def _like_members(family: Iterable[GroupView], group: GroupView, rank: int) -> list[tuple[GroupView, int]]:
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


def left_out(mine: P2POps, likes: list[P2POps]) -> Optional[LeftOut]:
    """The op the rank left out where its like ranks posted it (see module docstring);
    None where its ops are theirs, a part of theirs (it has not got so far), or differ
    otherwise, or where the like ranks disagree."""
    aligned = _aligned(mine, likes)
    if aligned is None:
        return None
    mine, likes, reference = aligned
    at = _first_difference(mine, reference)
    if at is None or at < MIN_OPS_IN_STEP:
        return None  # as a rule: a rank waiting for others has not got as far as its like ranks
    for skipped in range(1, MAX_BATCH_LEFT_OUT + 1):
        # A batch left out starts where the reference's batch holding the first difference
        # does: the rank's next batch may open with the same op.
        start = at if skipped == 1 else _batch_start(reference, at)
        after = min(LIKENESS_WINDOW, len(mine) - start, len(reference) - start - skipped)
        went_on = reference.channels[start + skipped:start + skipped + after]
        if after >= 1 and mine.channels[start:start + after] == went_on and (
                skipped == 1 or _one_batch_left_out(mine, reference, start, skipped, after)):
            break
    else:
        return None
    if start < MIN_OPS_IN_STEP:
        return None
    read = start + skipped + after  # of the reference: the like ranks must agree that far (as far as they got)
    if not all(ops.channels[:read] == reference.channels[:min(read, len(ops))] for ops in likes):
        return None  # the like ranks differ among themselves: no one program to compare with
    return LeftOut(reference.channels[start], mine.seqs[start], mine.first + start, len(likes), skipped)


def _aligned(mine: P2POps, likes: list[P2POps]) -> Optional[tuple[P2POps, list[P2POps], P2POps]]:
    """(mine, likes, the like ranks' ops that got furthest), each from the first number
    every one of them holds whole (a wrapped buffer may keep only the end of its oldest
    batch); None when the rank or every like rank holds nothing."""
    likes = [ops for ops in likes if len(ops)]
    if not len(mine) or not likes:
        return None
    start = max(ops.seqs[0] for ops in (mine, *likes)) + 1
    mine, likes = mine.since(start), [ops.since(start) for ops in likes]
    return mine, likes, max(likes, key=len)


def short_batch_at(family: Iterable[GroupView], group: GroupView, rank: int, ops_of: OpsOf) -> Optional[LeftOut]:
    """short_batch of the rank's newest ops in `group` against its like ranks' (as left_out_at)."""
    return short_batch(ops_of(group, rank, HISTORY_P2P_OPS), _likes(family, group, rank, ops_of))


def short_batch(mine: P2POps, likes: list[P2POps]) -> Optional[LeftOut]:
    """The ops missing from the rank's newest batch, where its ops up to it are its like
    ranks' (who agree among themselves) and their batch of that number holds more: a batch
    is posted whole, its ops recorded together, so the rank posted it without them. (Its
    ops are otherwise a part of theirs, which left_out reads as a rank behind them.) None
    when its newest batch is theirs, or more than MAX_BATCH_LEFT_OUT ops are missing."""
    aligned = _aligned(mine, likes)
    if aligned is None:
        return None
    mine, likes, reference = aligned
    end = len(mine)
    if end < MIN_OPS_IN_STEP or len(reference) <= end or _first_difference(mine, reference) is not None:
        return None
    newest = mine.seqs[end - 1]
    missing = 0
    while end + missing < len(reference) and reference.seqs[end + missing] == newest:
        missing += 1
    if not 0 < missing <= MAX_BATCH_LEFT_OUT:
        return None
    read = end + missing
    if not all(ops.seqs[:read] == reference.seqs[:read] and ops.channels[:read] == reference.channels[:read]
               for ops in likes):
        return None  # some like rank has not got through that batch, or posted another
    return LeftOut(reference.channels[end], newest, mine.first + end - 1, len(likes), missing, in_batch=True)


def _batch_start(ops: P2POps, at: int) -> int:
    """Where the batch (ops under one number) holding the op at `at` starts."""
    while at > 0 and ops.seqs[at - 1] == ops.seqs[at]:
        at -= 1
    return at


def _one_batch_left_out(mine: P2POps, reference: P2POps, start: int, skipped: int, after: int) -> bool:
    """The `skipped` ops of the reference from `start` are one batch (one P2P number, whole)
    and the rank's ops from `start` on are numbered one less than the reference's that
    follow it: the rank's counter never moved for the batch it left out."""
    left_out = reference.seqs[start:start + skipped]
    numbered_on = [seq + 1 for seq in mine.seqs[start:start + after]]
    return (len(set(left_out)) == 1 and reference.seqs[start + skipped] != left_out[0]
            and numbered_on == reference.seqs[start + skipped:start + skipped + after])


def _first_difference(mine: P2POps, reference: P2POps) -> Optional[int]:
    """Where the rank's ops first differ from its like ranks' (number or channel); None
    where one list runs out first."""
    length = min(len(mine), len(reference))
    if mine.seqs[:length] == reference.seqs[:length] and mine.channels[:length] == reference.channels[:length]:
        return None  # as a rule (a rank behind its like ranks), compared in C
    return next(at for at in range(length)
                if (mine.seqs[at], mine.channels[at]) != (reference.seqs[at], reference.channels[at]))
