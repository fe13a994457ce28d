"""Ranks dumped a moment apart in a healthy job are not a device stall or a desync.

Each rank writes its dump at its own moment. In a job dumped mid-op, a rank dumped a little
later may already have seen the op end (and the ops it had queued behind it), while the
others' dumps still hold it unfinished. That picture alone used to read as a FAULT: a
"device stall" of the ranks still in the op, or, where the later rank had reached the next
op, an "extra op" it went ahead with, or ops its peers "never started". Those peers hold
the op queued, and the finished ranks wait for nobody: the dumps cannot tell a GPU that
stopped from dumps taken at different moments, and the report says so without blaming
anyone. A real device stall, where the ranks that finished the op went on and then wait
for the stalled one, stays a FAULT.
"""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate

MOMENTS = "frontier.dumped_at_other_moments"


def _mid_op_job(group: str, late: tuple[int, ...], lookahead: int = 2, seed: int = 5):
    """A healthy TP 4 x DP 4 job dumped while every `group` group is in one collective;
    the ranks `late` were dumped once it had ended (every op they had issued finished)."""
    return generate(16, 4, 1, steps=3, fault=Fault("in_flight", rank=0, group=group, step=1, dumped_late=late),
                    timing=True, seed=seed, lookahead=lookahead, watchdog_ms=100.0, pg_status="work")


@pytest.mark.parametrize("group", ["dp", "tp"])
@pytest.mark.parametrize("late", [(0,), (5,), (0, 1, 2, 3), tuple(range(8)), tuple(range(1, 16))])
def test_a_healthy_job_dumped_a_moment_apart_blames_nobody(group, late):
    job = _mid_op_job(group, late)
    assert job.truth["status"] == "inconclusive" and job.truth["suspect_ranks"] == []
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    # Ops some rank finished are not stuck; where every group has such a rank, nothing is.
    assert diagnosis.status in ("healthy", "inconclusive")
    assert diagnosis.suspect_ranks == ()
    assert not any(f.severity == "error" for f in diagnosis.findings)
    said = [f for f in diagnosis.findings if f.rule == MOMENTS]
    if late == (0,) or (len(late) == 8 and group == "dp"):  # a group holds ranks of both kinds
        assert said, "the ranks still in the op that others finished are named"
    for finding in said:
        assert finding.severity == "info" and finding.suspect_ranks == ()
        finished = set(finding.evidence["finished_ranks"])
        assert finished <= set(late) and not set(finding.evidence["holding_ranks"]) & set(late)


def _finish_the_op_it_is_in(dump: dict) -> None:
    """The rank's dump a moment later: its oldest unfinished collective has ended (and its
    pg_status says so); what it queued behind it has not started."""
    entry = next(e for e in dump["entries"] if e["state"] != "completed" and not e["is_p2p"])
    entry["state"] = "completed"
    entry["time_discovered_started_ns"] = entry["time_discovered_started_ns"] or entry["time_created_ns"] + 1_000_000
    entry["time_discovered_completed_ns"] = entry["time_discovered_started_ns"] + 1_000_000
    entry["duration_ms"] = 1.0
    status = dump["pg_status"][str(entry["pg_id"])]
    status["last_started_collective"] = max(status["last_started_collective"], entry["collective_seq_id"])
    status["last_completed_collective"] = entry["collective_seq_id"]


@pytest.mark.parametrize("finished", [(1,), (1, 5), (1, 5, 9), (1, 5, 9, 13)])
def test_members_that_finished_the_op_and_wait_in_the_next_are_not_ahead(finished):
    """DP group {1, 5, 9, 13}: some members' dumps show the op done and the next one
    (which the others hold queued) not started yet. Before, one or two of them read as
    an extra op (a desync), and more as the others never starting the next op."""
    job = _mid_op_job("dp", ())
    dumps = dict(job.dumps)
    for rank in finished:
        _finish_the_op_it_is_in(dumps[rank])
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())  # the other groups are in flight
    assert not any(f.kind in ("extra_op", "not_issued", "stuck") for f in diagnosis.findings)
    if len(finished) < 4:
        said = [f for f in diagnosis.findings if f.rule == MOMENTS]
        assert [set(f.evidence["finished_ranks"]) for f in said] == [set(finished)]
        assert said[0].evidence["finished_a_later_op"] is False


@pytest.mark.parametrize("culprits", [(1,), (2, 5)])
def test_a_gpu_that_stopped_while_its_peers_went_on_and_wait_is_still_a_fault(culprits):
    job = generate(16, 2, 2, steps=3, fault=Fault("gpu_error", rank=culprits[0], ranks=culprits, step=1),
                   timing=True, seed=3, watchdog_ms=100.0, pg_status="work")
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", culprits) == \
        (job.truth["status"], tuple(job.truth["suspect_ranks"]))
    assert any(f.rule == "frontier.stuck_on_device" for f in diagnosis.findings)
    assert not any(f.rule == MOMENTS for f in diagnosis.findings)


@pytest.mark.parametrize("late", [(0,), (6,), (2, 9), tuple(range(1, 16))])
def test_a_rank_dumped_late_whose_own_group_ids_are_unknown_is_not_blamed(late):
    """Groups made in an order of each rank's own (hashed names) and only active entries:
    a rank dumped after the op ended holds nothing, so its rows of pg_status cannot be
    placed by its entries. A row that may be the group's (it enqueued no more than the
    group's newest op) says it finished the op its peers are still in: it is no longer
    read as having never joined them. (A rank that stopped issuing keeps being named:
    test_job_shapes.py, test_pg_status_is_read_under_the_ranks_own_pg_ids.)"""
    job = generate(16, 4, 1, steps=3, fault=Fault("in_flight", rank=3, group="tp", step=1, dumped_late=late),
                   only_active=True, pg_order="rotated", hashed_names=True, timing=True, seed=47,
                   watchdog_ms=100.0, pg_status="work")
    assert all(not job.dumps[rank]["entries"] for rank in late)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert diagnosis.status in ("healthy", "inconclusive")
    assert diagnosis.suspect_ranks == ()
    assert not any(f.severity == "error" or f.kind in ("not_issued", "extra_op") for f in diagnosis.findings)


@pytest.mark.parametrize("culprits, lost", [((0, 1), 2), ((0, 1), 3), ((8, 9), 11)])
def test_members_without_a_dump_may_have_finished_the_op_a_stall_holds(culprits, lost):
    """Two GPUs of one TP group of four stop; the dump of one of the two members that
    finished the op is lost. Counted against the two stalled ranks, the one finisher left
    made the stall read as dumps taken apart, and the verdict named the other finisher
    beside the culprits. A member without a dump may have finished the op too."""
    job = generate(16, 4, 2, steps=3, fault=Fault("gpu_error", rank=culprits[0], ranks=culprits, step=1, group="tp"),
                   timing=True, seed=3, watchdog_ms=100.0, pg_status="work", only_active=True)
    dumps = {rank: dump for rank, dump in dict(job.dumps).items() if rank != lost}
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", culprits) == \
        (job.truth["status"], tuple(job.truth["suspect_ranks"]))
    assert any(f.rule == "frontier.stuck_on_device" for f in diagnosis.findings)
