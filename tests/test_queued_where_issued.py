"""A rank that never reached the op its TP partner issued right before a TP collective
(blocked in an all_to_all whose expert peer stopped, or in that very op) has not skipped
the TP collective, whatever its own past looks like. An MoE step (more all_to_alls between
two TP collectives in the backward pass than in the forward) made its own past read as a
skip, and the TP partner's wait was blamed on it beside the rank that stopped."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts, job

GROUPS = {"tp0": ("TENSOR_MODEL_PARALLEL_GROUP", (0, 1)), "tp1": ("TENSOR_MODEL_PARALLEL_GROUP", (2, 3)),
          "ep0": ("EXPERT_MODEL_PARALLEL_GROUP", (0, 2)), "ep1": ("EXPERT_MODEL_PARALLEL_GROUP", (1, 3))}
TP = {0: "tp0", 1: "tp0", 2: "tp1", 3: "tp1"}
EP = {0: "ep0", 1: "ep1", 2: "ep0", 3: "ep1"}
# Forward: a TP all_reduce, dispatch and combine; backward: four all_to_alls, then TP again.
STEP = ["tp", "ep", "ep", "tp", "ep", "ep", "ep", "ep", "tp"]
# Rank 2 never issues the third or the fourth all_to_all of the second step's backward (the
# fourth is the op its peers issue right before the TP all_reduce).
STOPS = (9 + 6, 9 + 7)
TP_AT = 9 + 8  # the backward's TP all_reduce


def _ops(rank: int, count: int) -> list:
    names = {"tp": f"all_reduce@{TP[rank]}", "ep": f"all_to_all@{EP[rank]}"}
    return [names[kind] for kind in (STEP * 2)[:count]]


def moe_job(stop_at: int, queued: bool) -> dict:
    """Rank 2 stops before the all_to_all at `stop_at`. Rank 0, its expert peer, waits in
    it and (with `queued`) holds what follows up to its TP all_reduce queued behind; rank
    1, its TP partner, went on through its own expert group with rank 3 and waits in that
    all_reduce; rank 3 waits in its TP all_reduce for rank 2."""
    steps = {rank: _ops(rank, TP_AT + 1) for rank in (1, 3)}
    steps[2] = _ops(2, stop_at)
    steps[0] = _ops(0, stop_at + 1)
    if queued:
        steps[0] += [(op, {"state": "scheduled"}) for op in _ops(0, TP_AT + 1)[stop_at + 1:]]
    steps[1][TP_AT] = (steps[1][TP_AT], {"state": "started"})
    return job(steps, groups=GROUPS)


@pytest.mark.parametrize("stop_at", STOPS)
@pytest.mark.parametrize("queued", [True, False])
def test_a_rank_behind_its_tp_partner_is_not_said_to_have_skipped_the_tp_op(stop_at, queued):
    # Without the queued ops: the device view of the same job, rank 0 blocked in the
    # all_to_all and nothing after it.
    _, diagnosis = analyse_dicts(moe_job(stop_at, queued), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (2,))
    roots = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert [(f.kind, f.pg_name, f.suspect_ranks) for f in roots] == [("not_issued", "ep0", (2,))]
    (tp_wait,) = [f for f in diagnosis.findings if f.pg_name == "tp0"]
    assert not tp_wait.is_root and not tp_wait.went_past


def test_a_last_stage_that_skips_its_embedding_all_reduce_is_still_named():
    # Two pipelines of two stages; the embedding group joins each pipeline's first and last
    # stage. Rank 1 (a last stage) leaves out its embedding all_reduce in the last step and
    # goes on to the next step's recv. The op its embedding peer issued right before that
    # all_reduce is a recv of its own part (rank 1's side of the channel is a send), so it
    # says nothing of whether rank 1 got there: its own past still names it.
    groups = {"pp0": ("PIPELINE_MODEL_PARALLEL_GROUP", (0, 1)), "pp1": ("PIPELINE_MODEL_PARALLEL_GROUP", (2, 3)),
              "dp0": ("DATA_PARALLEL_GROUP", (0, 2)), "dp1": ("DATA_PARALLEL_GROUP", (1, 3)),
              "emb0": ("EMBEDDING_GROUP", (0, 1)), "emb1": ("EMBEDDING_GROUP", (2, 3))}
    pipeline, data, embedding = {0: "pp0", 1: "pp0", 2: "pp1", 3: "pp1"}, {0: "dp0", 1: "dp1", 2: "dp0", 3: "dp1"}, \
        {0: "emb0", 1: "emb0", 2: "emb1", 3: "emb1"}

    def step(rank: int, with_embedding: bool = True) -> list:
        p2p = ["send 0->1", "recv 0<-1"] if rank in (0, 2) else ["recv 1<-0", "send 1->0"]
        ops = [f"{op}@{pipeline[rank]}" for op in p2p]
        return ops + ([f"all_reduce@{embedding[rank]}"] if with_embedding else []) + [f"all_reduce@{data[rank]}"]

    steps = {0: (step(0) * 3)[:-1],  # waits in its last embedding all_reduce
             1: step(1) * 2 + step(1, with_embedding=False) + ["recv 1<-0@pp0"],
             2: step(2) * 3,  # waits in its last data-parallel all_reduce for rank 0
             3: step(3) * 3 + ["recv 1<-0@pp1"]}
    _, diagnosis = analyse_dicts(job(steps, groups=groups), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1,))
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert (root.pg_name, root.suspect_ranks) == ("emb0", (1,)) and root.went_past[1].confirmed
