"""The heuristics about a rank's own past: whether a rank no like rank can judge skipped an op.

Takes `Programs` (program.py), a finding and an absent rank; returns `WentPast`
evidence when what the rank did since its last op on the finding's channel repeats its
earlier steps that went on past an op like the missing one. Each heuristic reads at most
a few hundred of the rank's ops (HISTORY_SPAN) and its last few ops on the channel
(HISTORY_TRIES).
"""

from __future__ import annotations

from itertools import islice
from typing import Optional

from frtrace.diagnosis.finding import Finding, WentPast
from frtrace.diagnosis.program import Channel, OpForm, Programs, form_of, name_channel, newest_p2p_names, p2p_channel
from frtrace.match.matcher import RankStream
from frtrace.table.seq_map import RowList

HISTORY_RANKS = 8  # absent ranks per finding checked that way, at most
HISTORY_SPAN = 256  # ops since its last op on the channel, at most
HISTORY_TRIES = 4  # earlier occurrences of the op to compare with


def past_says_skipped(program: Programs, rank: int, channel: list[int], op_form: Optional[OpForm]) -> Optional[WentPast]:
    """With nobody like it to compare with, a rank's own past: if what it did since
    its last op on the channel (`channel`: positions, oldest first) repeats a stretch
    of its past that led up to an op of the missing one's form (`op_form`; None
    when every op on the channel is) and then goes on as its past went on after
    that op, it skipped the op this time."""
    if len(channel) < 2:
        return None
    start = program.following(rank, channel[-1])
    if start is None:
        return None  # it stands right after its last op there: behind
    end = len(program.entries[rank])
    now, whole = program.forms_from(rank, start, end, HISTORY_SPAN)
    if not whole:
        return None  # no stretch of its past can be compared with an unfinished one
    tries = 0
    last_form = program.form_at(rank, channel[-1])
    for j in range(len(channel) - 1, 0, -1):
        if tries == HISTORY_TRIES:
            break
        form_here = form_of(program.token(rank, channel[j]))
        if op_form is not None and form_here != op_form:
            continue
        tries += 1
        # The stretch that led up to that op began after an op on the channel like the
        # rank's last one there: it is where the rank stands now in an earlier step.
        aligned = program.form_at(rank, channel[j - 1]) == last_form
        before, complete = program.forms_from(rank, program.following(rank, channel[j - 1]), channel[j], HISTORY_SPAN, now)
        if not complete or now[:len(before)] != before[:len(now)]:
            continue
        # Nothing led up to that op (it came right after the one before it on the
        # channel): any stretch starts like that, so it tells where the op comes only
        # where that one was like the rank's last op on the channel and unlike the op
        # (ops alike in a row, a ring's steps, leave the place open).
        if not before and (not aligned or last_form == form_here):
            continue
        if len(now) <= len(before):
            if not aligned:
                continue  # a stretch after another kind of op: another place in the step
            return None  # still on the stretch that leads up to the op: behind
        after, _ = program.forms_from(rank, program.following(rank, channel[j]), end, len(now) - len(before))
        if now[len(before):] == after:
            return program.went_past(rank, program.nth_following(rank, start, len(before)), 0, True)
    return None


def neighbours_say_skipped(program: Programs, rank: int, channel: list[int], op_form: Optional[OpForm]) -> Optional[WentPast]:
    """A rank's own past, op by op, where its steps differ too much for
    `past_says_skipped` to find a whole stretch repeated: if an op of one form B
    always came right before the ops of the missing one's form (`op_form`; at
    least two of them), and every B it issued until now was followed by one, a B
    followed by an op that in its past came right after the missing op says it
    skipped the op this time. Its last HISTORY_TRIES such ops are read."""
    if op_form is None:
        return None
    # The last HISTORY_TRIES, found newest first: the older ones' tokens are not read.
    newest_first = (p for p in reversed(channel) if form_of(program.token(rank, p)) == op_form)
    ops = list(islice(newest_first, HISTORY_TRIES))[::-1]
    if len(ops) < 2:
        return None
    befores = {program.form_at(rank, program.previous(rank, p)) for p in ops}
    if len(befores) != 1 or None in befores:
        return None
    (before,) = befores
    assert before is not None
    afters = {program.form_at(rank, program.following(rank, p)) for p in ops} - {None}
    return _first_b_off_the_op(program, rank, ops, before, op_form, afters)


def _first_b_off_the_op(program: Programs, rank: int, ops: list[int], before: OpForm, op_form: OpForm,
                        afters: set[Optional[OpForm]]) -> Optional[WentPast]:
    """From the oldest of `ops` on, the first op of form `before` (B) not followed by
    one of `op_form`: a skip if it comes after the last of `ops` and goes on as the op
    used to (`afters`); otherwise B is no sign."""
    position, read = program.previous(rank, ops[0]), 0
    while position is not None and read < 2 * HISTORY_SPAN:
        if program.form_at(rank, position) == before:
            then = program.following(rank, position)
            if then is None:
                return None  # it stands right after a B: behind
            form = program.form_at(rank, then)
            if form != op_form:
                skipped = position > ops[-1] and form in afters
                return program.went_past(rank, then, 0, True) if skipped else None
        position, read = program.following(rank, position), read + 1
    return None


# Turns (ops on the two channels, newest first) that show a skip: the other channel twice,
# then one earlier step (d d c); twice that many steps (d d c d c) where the rank's buffer
# wrapped and the turns run back to its oldest op: a pipeline's warm-up also posts on one
# channel twice, and what came before the oldest op is not there to rule that out.
TURNS_SHOWING_A_SKIP = 3
TURNS_SHOWING_A_SKIP_TO_A_WRAPPED_START = 5


def turns_say_skipped(program: Programs, rank: int, p2p: RowList, skipped: Channel,
                      clipped: bool = False) -> Optional[WentPast]:
    """A rank whose P2P ops in a group (`p2p`, oldest first) took turns between the
    `skipped` channel and one other (a first pipeline stage's forward send and
    backward recv, one micro-batch per step: c d c d) and then posted on the other
    one twice (c d c d d) went past its op on the skipped channel: nothing in its past
    lets the second come first. Its own past says so with a single earlier step,
    where `past_says_skipped` needs two; with two where its buffer wrapped (`clipped`)
    and the turns reach back to its oldest op."""
    if len(p2p) < 3:
        return None
    newest = p2p[-1]
    other = p2p_channel(newest)
    if other == skipped:
        return None
    # Newest first: other, other, skipped, other, skipped, other ... to the oldest read.
    # Read op by op, off the codes (no entry built): most ranks asked about break the
    # pattern within a few ops.
    turns = read = 0
    for _, name in islice(newest_p2p_names(p2p), HISTORY_SPAN):
        read += 1
        channel = name_channel(name)
        if channel == skipped or channel == other:
            if channel != (skipped if turns % 2 == 0 and turns > 0 else other):
                return None
            turns += 1
    to_its_start = clipped and read == len(p2p)
    if turns < (TURNS_SHOWING_A_SKIP_TO_A_WRAPPED_START if to_its_start else TURNS_SHOWING_A_SKIP):
        return None
    position = program.position(rank, newest)
    return program.went_past(rank, position, 0, True) if position is not None else None


def finding_turns_say_skipped(program: Programs, finding: Finding, rank: int) -> Optional[WentPast]:
    """turns_say_skipped on the rank's P2P ops in the finding's group."""
    stream = _stream(program, finding, rank)
    return turns_say_skipped(program, rank, stream.p2p, unposted_channel(finding), stream.clipped) if stream else None


def channel_positions(program: Programs, finding: Finding, rank: int) -> list[int]:
    """Positions of the rank's earlier ops on the finding's channel, oldest first: its
    collectives of the group before the op, or its P2P ops like the one never posted."""
    stream = _stream(program, finding, rank)
    if stream is None:
        return []
    if finding.kind == "p2p_unmatched":
        return _p2p_channel_positions(program, finding, rank, stream)
    return _collective_channel_positions(program, finding, rank, stream)


def _stream(program: Programs, finding: Finding, rank: int) -> Optional[RankStream]:
    view = program.views.get(finding.group_id) if finding.group_id is not None else None
    return view.streams.get(rank) if view else None


def _p2p_channel_positions(program: Programs, finding: Finding, rank: int, stream: RankStream) -> list[int]:
    wanted = unposted_channel(finding)
    newest_first = (k for k, name in newest_p2p_names(stream.p2p) if name_channel(name) == wanted)
    positions = (program.p2p_position(rank, stream.p2p, k) for k in newest_first)
    # Every op on the channel is like the one never posted, so `past_says_skipped`
    # reads no further back than its last HISTORY_TRIES + 1: finding the rest would
    # scan a long pipeline run's every send and recv, once per finding.
    return list(islice((p for p in positions if p is not None), HISTORY_TRIES + 1))[::-1]


def _collective_channel_positions(program: Programs, finding: Finding, rank: int, stream: RankStream) -> list[int]:
    collectives = stream.collectives
    assert finding.collective_seq_id is not None  # a collective's finding (see went_past_finding)
    seqs = [s for s in sorted(collectives) if s < finding.collective_seq_id]
    # Rows of the rank's table: its ops placed without building them.
    positions = (program.row_position(rank, collectives.table, row) for row in collectives.first_rows(seqs))
    return [p for p in positions if p is not None]


def unposted_channel(finding: Finding) -> Channel:
    """The channel (op, group-local src, dst) of the send or recv a P2P finding says was
    never posted: the other end of its anchor."""
    anchor = finding.anchor
    assert anchor is not None  # P2P findings hold the op that was posted
    return "recv" if anchor.op == "send" else "send", anchor.name.local_src, anchor.name.local_dst
