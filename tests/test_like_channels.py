"""like_channels.left_out: the P2P op a rank left out, found by comparing its sends and recvs
op by op with the ranks at its place in the sibling groups."""

from __future__ import annotations

from frtrace.diagnosis.like_channels import left_out, short_batch
from frtrace.diagnosis.program import P2POps

SEND, RECV = ("send", 0, 1), ("recv", 3, 0)  # a first stage's forward send and its recv from the last


def ops(*steps: tuple[int, tuple[str, int, int]], first: int = 0) -> P2POps:
    return P2POps([seq for seq, _ in steps], [channel for _, channel in steps], first)


def ring(steps: range, skip: int | None = None, drop: int = 0) -> P2POps:
    """Batched ring steps (recv, then send, one number each); `skip`: that step's send left
    out; `drop`: ops a wrapped buffer lost from the start."""
    held = [op for n in steps for op in ((n, RECV), (n, SEND)) if not (n == skip and op[1] == SEND)][drop:]
    return ops(*held, first=0)


def test_a_send_left_out_then_the_like_ranks_steps_is_found_where_the_rank_went_on():
    found = left_out(ring(range(1, 10), skip=5), [ring(range(1, 12)), ring(range(1, 11))])
    assert found is not None
    assert found.channel == SEND
    assert found.went_on_seq == 6  # its recv of step 6, issued where they sent in step 5
    assert found.went_on == 9  # its tenth op: steps 1-4 (8 ops), step 5's recv, then that
    assert found.like_ranks == 2


def test_a_rank_behind_its_like_ranks_left_nothing_out():
    assert left_out(ring(range(1, 6)), [ring(range(1, 12))]) is None


def test_like_ranks_that_differ_among_themselves_decide_nothing():
    assert left_out(ring(range(1, 10), skip=5), [ring(range(1, 12)), ring(range(1, 12), skip=7)]) is None


def test_a_rank_that_issued_something_else_rather_than_leaving_one_out_is_not_read_as_a_skip():
    other = ring(range(1, 10))
    other.channels[9] = ("send", 0, 2)  # a send to another stage where theirs went to stage 1
    assert left_out(other, [ring(range(1, 12))]) is None


def test_wrapped_buffers_are_compared_from_the_first_number_every_one_holds_whole():
    # The like rank's buffer starts in the middle of step 3: compared from step 4 on.
    like = ring(range(1, 12), drop=5)
    found = left_out(ring(range(1, 10), skip=7), [like])
    assert found is not None and found.went_on_seq == 8


def test_a_skip_too_close_to_where_the_comparison_starts_says_nothing():
    # Fewer than MIN_OPS_IN_STEP ops in common before it: no shared step shows the rank in step.
    assert left_out(ring(range(1, 10), skip=2), [ring(range(1, 12))]) is None


STEPS = ([RECV, SEND], [RECV], [SEND])  # a pipeline's steps differ: a batch of both, then one of each


def batched_steps(steps: range, skip: int | None = None) -> P2POps:
    """Step n one batch under one number (its ops STEPS[n % 3]); `skip`: that step's batch
    left out, the later ones numbered one less (the rank's counter never moved)."""
    held, number = [], 0
    for n in steps:
        if n == skip:
            continue
        number += 1
        held += [(number, channel) for channel in STEPS[n % 3]]
    return ops(*held)


def test_a_whole_batch_left_out_is_found_with_its_ops_counted():
    found = left_out(batched_steps(range(1, 12), skip=6), [batched_steps(range(1, 14)), batched_steps(range(1, 13))])
    assert found is not None
    assert (found.channel, found.ops) == (RECV, 2)  # the batch's first op, and both of its ops
    assert found.went_on_seq == 6  # its step 7, numbered 6: where they posted step 6


def test_a_batch_that_is_not_whole_left_out_is_no_skip():
    # Step 6's recv left out, its send kept: not a batch left out, nor one op (its number
    # stays), and the rank's later ops are numbered as theirs.
    mine = batched_steps(range(1, 12))
    cut = mine.seqs.index(6)
    odd = P2POps(mine.seqs[:cut] + mine.seqs[cut + 1:], mine.channels[:cut] + mine.channels[cut + 1:], 0)
    found = left_out(odd, [batched_steps(range(1, 14))])
    assert found is None or found.ops == 1


def _newest_batch_short(steps: range, drop: int) -> P2POps:
    """The rank's ops of `steps`, its newest batch posted without its last `drop` ops."""
    mine = batched_steps(steps)
    return P2POps(mine.seqs[:-drop], mine.channels[:-drop], 0)


def test_a_newest_batch_posted_short_of_its_like_ranks_batch_left_those_ops_out():
    mine = _newest_batch_short(range(1, 7), drop=1)  # step 6 (a recv and a send) posted without its send
    found = short_batch(mine, [batched_steps(range(1, 12)), batched_steps(range(1, 10))])
    assert found is not None
    assert (found.channel, found.ops, found.went_on_seq) == (SEND, 1, 6)
    assert found.went_on == len(mine) - 1  # it waits in that batch, its newest op
    # left_out reads the same ops as a rank behind its like ranks.
    assert left_out(mine, [batched_steps(range(1, 12))]) is None


def test_a_newest_batch_like_its_like_ranks_or_unread_by_them_is_not_short():
    assert short_batch(batched_steps(range(1, 7)), [batched_steps(range(1, 12))]) is None  # a rank behind them
    short = _newest_batch_short(range(1, 7), drop=1)
    # A like rank that has not got through that batch, or like ranks that differ there: nothing to say.
    assert short_batch(short, [batched_steps(range(1, 6))]) is None
    assert short_batch(short, [batched_steps(range(1, 12)), batched_steps(range(2, 13))]) is None
