"""Representative cases of the synthetic fault sweep (layouts x faults x lookahead x
timing) that once named the wrong culprit: a rank that skips a collective and blocks
further on, a send never posted in a three-stage pipeline, and a straggler seen only
through two-member groups. Each case checks the verdict against the truth file."""

import pytest
from helpers import analyse_dicts, assert_fault_kind_named

from frtrace.testing.synth import Fault, generate

# (world, tp, pp), fault kind, group, culprit, step, lookahead, timing
CASES = [
    # Skipped TP collective: the culprit's peers wait in it while it blocks in PP,
    # DP and the default group, whose findings all look like roots on their own.
    ((8, 2, 2), "skip_op", "tp", 1, 1, 0, False),  # two-member TP groups: an even split
    ((16, 2, 2), "skip_op", "tp", 5, 2, 2, True),
    ((16, 4, 2), "skip_op", "tp", 1, 1, 0, False),
    ((16, 4, 2), "skip_op", "tp", 5, 0, 1, True),
    # Skipped pipeline and default-group collectives with three stages.
    ((12, 1, 3), "skip_op", "pp", 5, 1, 0, False),
    ((12, 1, 3), "skip_op", "default", 5, 1, 1, False),
    ((12, 1, 3), "skip_op", "default", 1, 0, 0, True),
    ((16, 4, 2), "skip_op", "pp", 5, 2, 2, False),
    ((16, 4, 2), "skip_op", "default", 5, 1, 0, True),
    # A send never posted: the receiver's neighbour waits too, and must not be blamed.
    ((12, 1, 3), "p2p_unmatched", "pp", 5, 1, 0, False),
    ((12, 1, 3), "p2p_unmatched", "pp", 5, 2, 2, True),
    # Stragglers where every TP, PP and DP group has two members.
    ((8, 2, 2), "straggler", "tp", 1, 1, 0, False),
    ((8, 2, 2), "straggler", "tp", 5, 1, 0, True),
    # Kept right while the above were fixed: an extra op stays an extra op, and a rank
    # blocked in a recv that comes before the collective it is absent from is a victim,
    # even though a few collectives it shares with other stages look alike.
    ((8, 2, 2), "extra_op", "tp", 1, 1, 0, False),
    ((12, 1, 3), "extra_op", "pp", 5, 1, 1, True),
    ((8, 2, 2), "p2p_unmatched", "pp", 1, 1, 0, False),
    ((16, 4, 2), "p2p_unmatched", "pp", 5, 2, 1, True),
]


def _case_id(case) -> str:
    (world, tp, pp), kind, group, rank, step, lookahead, timing = case
    return f"{world}-{tp}-{pp}-{kind}-{group}-r{rank}-s{step}-la{lookahead}-t{int(timing)}"


def _diagnose(world, tp, pp, steps=3, **options):
    job = generate(world, tp, pp, steps=steps, **options)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    return job.truth, diagnosis


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sweep_case_names_the_culprit(case):
    (world, tp, pp), kind, group, rank, step, lookahead, timing = case
    truth, diagnosis = _diagnose(world, tp, pp, timing=timing, lookahead=lookahead,
                                 fault=Fault(kind, rank=rank, group=group, step=step))
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (truth["status"], truth["suspect_ranks"])
    assert_fault_kind_named(truth, diagnosis)


def test_a_skipped_op_is_reported_where_it_was_skipped_with_what_came_instead():
    truth, diagnosis = _diagnose(16, 4, 2, fault=Fault("skip_op", rank=1, group="tp", step=1))
    roots = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert [(f.kind, f.pg_name, f.collective_seq_id, f.suspect_ranks) for f in roots] == [
        ("not_issued", truth["group"]["name"], truth["collective_seq_id"], (1,))
    ]
    went_past = roots[0].evidence["went_past"]["1"]
    assert went_past["skipped"] and went_past["evidence"] == "like_ranks"
    # The findings the skip caused in other groups are consequences, not suspects.
    assert all(not f.suspect_ranks for f in diagnosis.findings if not f.is_root)


def test_without_like_ranks_a_rank_is_compared_with_its_own_earlier_steps():
    # One eight-stage pipeline: no other rank plays rank 3's part, but its earlier
    # steps show the loss all_reduce it skipped comes before the recv it blocks in.
    truth, diagnosis = _diagnose(8, 1, 8, steps=4, fault=Fault("skip_op", rank=3, group="default", step=2))
    assert list(diagnosis.suspect_ranks) == truth["suspect_ranks"] == [3]
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert root.evidence["went_past"]["3"]["evidence"] == "own_past"


@pytest.mark.parametrize("timing", [False, True], ids=["no-timing", "timing"])
@pytest.mark.parametrize("layout", [(8, 2, 2), (4, 2, 1), (8, 1, 8)], ids=lambda l: "-".join(map(str, l)))
def test_healthy_jobs_with_two_member_groups_have_no_straggler(layout, timing):
    for buffer_size in (2000, 30):
        truth, diagnosis = _diagnose(*layout, steps=5, timing=timing, buffer_size=buffer_size, seed=7)
        assert diagnosis.status == truth["status"] == "healthy", diagnosis.verdict


@pytest.mark.parametrize("pipelines", [1, 2])
@pytest.mark.parametrize("step", [1, 2])
def test_a_first_stage_that_skips_its_send_after_one_step_is_blamed_not_its_peer(step, pipelines):
    # Stage 0 of an eight-stage pipeline (or of the first of two four-stage ones, whose
    # other stage 0 cannot tell) never posts step `step`'s forward send and waits in the
    # backward recv, while stage 1 waits for that send: a deadlock of two P2P findings.
    # With one earlier step its channels took turns (send, recv), and the second recv
    # in a row shows it went past the send; stage 1, which receives before it sends,
    # only waits.
    truth, diagnosis = _diagnose(8, 1, 8 // pipelines, steps=4,
                                 fault=Fault("p2p_unmatched", rank=0, group="pp", step=step))
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == ("faults", truth["suspect_ranks"]) == ("faults", [0])
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert (root.kind, root.suspect_ranks) == ("p2p_unmatched", (0,))
    assert root.evidence["went_past"]["0"]["skipped"]


def test_a_rank_whose_steps_differ_is_compared_with_its_past_op_by_op():
    # Two four-stage pipelines: stage 0 of the first skips step 2's loss all_reduce in
    # the default group and goes on to the next step's forward send, which stage 1
    # (waiting in the all_reduce) never receives. Its one like rank is stuck in the
    # all_reduce, so it cannot say what comes next, and the steps in between differ
    # (an all_to_all, reduce-scatter or all-reduce), so no whole stretch repeats; but
    # each earlier step issued the all_reduce right after the all_gather, and the send
    # right after the all_reduce.
    truth, diagnosis = _diagnose(8, 1, 4, steps=4, fault=Fault("skip_op", rank=0, group="default", step=2))
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == ("faults", truth["suspect_ranks"]) == ("faults", [0])
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert (root.kind, root.suspect_ranks) == ("not_issued", (0,))
    assert root.evidence["went_past"]["0"] == {**root.evidence["went_past"]["0"], "evidence": "own_past", "skipped": True}
