"""A GPU whose reports stop while it still runs (a GPU error leaves its watchdog blind):
its dump shows what it ran as unfinished. Its sends and recvs then look unmatched where
the other end's ring buffer wrapped, and the other end must not be blamed for them when
another finding shows the GPU ran past them."""

from __future__ import annotations

from helpers import analyse_dicts, job

_GROUPS = {"tp0": ("TP", (0, 1)), "tp1": ("TP", (2, 3)), "pp0": ("PP", (0, 2)), "pp1": ("PP", (1, 3))}
_STALE = {"state": "scheduled"}


def _stale_receiver_job(collectives_first: bool = False) -> dict:
    """4 ranks, TP groups [0,1] and [2,3], pipelines [0,2] and [1,3], whole dumps with
    timing. Rank 2's reports stop after its second recv: its third to fifth recvs and
    its two TP all_reduces show `scheduled`, though they ran (rank 0 finished its sends,
    rank 3 the all_reduces); then its host blocks. Rank 3 waits in TP all_reduce #3 for
    it, rank 1 in a send to rank 3, rank 0 in TP all_reduce #3 for rank 1. Rank 0's ring
    buffer lost its first two sends, rank 2's its first recv. `collectives_first`: rank 2
    issued its two all_reduces before its recvs."""
    recvs = ["recv 1<-0@pp0"] * 2 + [("recv 1<-0@pp0", _STALE)] * 3
    collectives = [("all_reduce@tp1", _STALE)] * 2
    steps = {
        0: ["send 0->1@pp0"] * 5 + ["all_reduce@tp0"] * 3,
        1: ["send 0->1@pp1"] * 5 + ["all_reduce@tp0"] * 2 + ["send 0->1@pp1"],
        2: collectives + recvs if collectives_first else recvs + collectives,
        3: ["recv 1<-0@pp1"] * 5 + ["all_reduce@tp1"] * 3,
    }
    dumps = job(steps, groups=_GROUPS)
    dumps[0]["entries"] = dumps[0]["entries"][2:]
    dumps[2]["entries"] = [e for e in dumps[2]["entries"] if not (e["is_p2p"] and e["p2p_seq_id"] == 1)]
    return dumps


def test_a_recv_of_a_gpu_shown_to_have_run_past_it_does_not_blame_its_sender():
    # Rank 2's recv #3 pairs with no send of rank 0 (rank 0's finished sends pair from
    # the newest back with rank 2's finished recvs): read so, rank 0 "never posted" it.
    _, diagnosis = analyse_dicts(_stale_receiver_job(), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (2,))
    (instead,) = [f for f in diagnosis.findings if f.rule == "p2p.op_run_unreported"]
    assert (instead.kind, instead.own_suspects, instead.p2p_seq_id) == ("stuck", (2,), 3)
    assert instead.facts["ran_past"] == "all_reduce" and instead.facts["partner"] == 0
    assert not any(f.kind == "p2p_unmatched" and 0 in f.own_suspects for f in diagnosis.findings)


def test_a_stall_shown_only_before_the_recv_leaves_the_recv_as_it_is():
    # The collectives its peers finished were issued before the recv: nothing shows the
    # GPU ran past the recv, so the finding about it stands.
    _, diagnosis = analyse_dicts(_stale_receiver_job(collectives_first=True), render=False)
    assert not any(f.rule == "p2p.op_run_unreported" for f in diagnosis.findings)
    assert any(f.kind == "p2p_unmatched" and f.own_suspects == (0,) for f in diagnosis.findings)
