"""A rank's P2P turns (own_past.turns_say_skipped) where its ring buffer wrapped.

A middle pipeline stage that received from the next stage once and then twice from the
previous one (c d d) went past a receive from the next stage, if that is all it ever
did. When its buffer wrapped and those three turns are the oldest it still holds, what
came before (a pipeline's warm-up also receives twice in a row) is gone: that is not
evidence that it skipped, and the rank, blocked in a collective its peer never issued,
is a consequence of that peer, not a second culprit. Two alternations (c d c d d) still
show the skip."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts, job

GROUPS = {"0": ("default_pg", (0, 1, 2, 3)), "pp": ("pp", (0, 1, 2)), "x": ("x", (1, 3))}


def _job(rank_1_turns: list, wrapped: bool) -> dict:
    """Rank 2 sends to rank 1 once more than rank 1 receives; rank 1 then waits in an
    all_reduce of group x that rank 3 never issues. `rank_1_turns`: rank 1's receives from
    stage 2 ("c") and stage 0 ("d"), oldest first, each "d" followed by a send to stage 2."""
    ops = {"c": ["recv 1<-2@pp"], "d": ["recv 1<-0@pp", "send 1->2@pp"]}
    rank_1 = ["all_reduce"] + [op for turn in rank_1_turns for op in ops[turn]] + ["all_reduce@x"]
    received_from_2, received_from_0 = rank_1_turns.count("c"), rank_1_turns.count("d")
    dumps = job({0: ["all_reduce"] + ["send 0->1@pp"] * received_from_0,
                 1: rank_1,
                 2: ["all_reduce"] + ["send 2->1@pp", "recv 2<-1@pp"] * received_from_2
                 + ["recv 2<-1@pp"] * (received_from_0 - received_from_2) + ["send 2->1@pp"],
                 3: ["all_reduce"]}, groups=GROUPS)
    if wrapped:  # older records fell off rank 1's ring
        for entry in dumps[1]["entries"]:
            entry["record_id"] += 100
    return dumps


def _unmatched_send_to_rank_1(diagnosis):
    (finding,) = [f for f in diagnosis.findings if f.kind == "p2p_unmatched" and f.p2p_ends.missing_on == 1]
    return finding


def test_three_turns_back_to_a_wrapped_start_are_no_skip():
    _, diagnosis = analyse_dicts(_job(["c", "d", "d"], wrapped=True), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,))
    finding = _unmatched_send_to_rank_1(diagnosis)
    assert not finding.is_root and not finding.went_past


@pytest.mark.parametrize("turns, wrapped", [(["c", "d", "d"], False), (["c", "d", "c", "d", "d"], True),
                                            (["c", "d", "c", "d", "d"], False)])
def test_turns_that_show_the_skip_still_blame_the_rank(turns, wrapped):
    _, diagnosis = analyse_dicts(_job(turns, wrapped), render=False)
    finding = _unmatched_send_to_rank_1(diagnosis)
    assert finding.is_root and finding.went_past[1].confirmed
    assert 1 in diagnosis.suspect_ranks
