"""Job shapes a third, independent generator showed frtrace getting wrong (issue 24): a rank
that skips a step of a context-parallel ring, cascades through an interleaved pipeline, groups
created in another order on each rank (rank-local pg_ids) with only-active dumps, and healthy
jobs dumped while every rank is in the middle of a collective. Each faulty job is run through
the CLI (status, suspects, exit code) beside a healthy twin that must stay healthy."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import analyse_dicts, job, write_job, write_synth_job

from frtrace.cli.analyse import frtrace
from frtrace.testing.synth import Fault, generate

EXIT = {"healthy": 0, "faults": 1, "inconclusive": 3}
# What PyTorch does (see test_synth_faithful_sweep.py).
FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}


def verdict(tmp_path, synth_job) -> tuple[str, list[int], int, dict]:
    """(status, suspects, exit code, report) of `frtrace DIR --format json` on the job's files."""
    directory = write_synth_job(tmp_path / "dumps", synth_job)
    result = CliRunner().invoke(frtrace, [str(directory), "--format", "json"])
    report = json.loads(result.stdout)
    return report["status"], report["suspect_ranks"], result.exit_code, report


def assert_truth(tmp_path, synth_job) -> dict:
    status, suspects, code, report = verdict(tmp_path, synth_job)
    truth = synth_job.truth
    assert (status, suspects, code) == (truth["status"], truth["suspect_ranks"], EXIT[truth["status"]]), report["summary"]
    return report


# --------------------------------------------------------------------------- context-parallel rings


@pytest.mark.parametrize("p2p", ["plain", "batched"])
@pytest.mark.parametrize("cp, ring_step", [(4, -1), (4, 0), (8, 2)])
def test_a_rank_that_skips_a_ring_step_is_the_one_blamed(tmp_path, cp, ring_step, p2p):
    # Its next ring ops pair with its neighbours' skipped ones until the tensors differ (the
    # backward ring's are twice as large): there its neighbours, and theirs, wait. The ranks
    # of the other ring stall in the data-parallel group behind it.
    culprit = cp + 2  # second data-parallel replica, tp rank 0, third ring position
    synth_job = generate(4 * cp, tp=2, pp=cp, steps=3, ring=True, p2p=p2p, timing=True, lookahead=6,
                         fault=Fault("skip_ring_step", rank=culprit, group="cp", step=1, ring_step=ring_step))
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    roots = [f for f in report["findings"] if f["root_cause"] and f["suspect_ranks"]]
    assert [(f["rule"], f["suspect_ranks"]) for f in roots] == [("p2p.skipped_ring_step", [culprit])]


@pytest.mark.parametrize("world, tp, cp, culprit, p2p, seed, lookahead", [
    (8, 1, 4, 1, "plain", 615, 0), (16, 2, 4, 0, "batched", 311, 0), (32, 2, 4, 31, "plain", 711, 0),
    (16, 2, 8, 14, "batched", 476, 0), (32, 2, 4, 3, "batched", 599, 0)])
def test_a_send_left_out_of_a_ring_is_blamed_on_its_sender_alone(tmp_path, world, tp, cp, culprit, p2p, seed,
                                                                  lookahead):
    # One send of a ring step left out, and the rank goes on: its later sends each pair one
    # step off, until the pair where the tensors differ (the backward ring's are twice as
    # large), where both ends wait, so no op after it lines up to say which end skipped.
    # The ranks at its place in the other rings posted one more send on that channel: the
    # sender was named with its neighbour.
    synth_job = generate(world, tp=tp, pp=cp, steps=3, ring=True, p2p=p2p, timing=True, seed=seed, lookahead=lookahead,
                         **FAITHFUL, fault=Fault("p2p_unmatched", rank=culprit, group="pp", step=1 + seed % 2))
    assert synth_job.truth["suspect_ranks"] == [culprit]
    assert_truth(tmp_path, synth_job)


@pytest.mark.parametrize("cp, ring_step", [(4, -1), (8, 2)])
def test_a_ring_step_skipped_in_only_active_dumps_is_blamed_on_the_rank_that_skipped_it(tmp_path, cp, ring_step):
    # The ring's finished steps are left out, so the channel where the tensors first differ
    # holds nothing before that pair: what the ring's other channels move there shows that
    # the neighbour's op is a step of the program, and the rank whose ops line up with it
    # one later skipped it. Before, both ends were named.
    culprit = cp + 2
    synth_job = generate(4 * cp, tp=2, pp=cp, steps=3, ring=True, p2p="plain", timing=True, lookahead=6,
                         only_active=True, fault=Fault("skip_ring_step", rank=culprit, group="cp", step=1,
                                                       ring_step=ring_step), **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    roots = [f for f in report["findings"] if f["root_cause"] and f["suspect_ranks"]]
    assert [(f["rule"], f["suspect_ranks"]) for f in roots] == [("p2p_sizes.skipped_one", [culprit])]


@pytest.mark.parametrize("kind, culprit, seed, lookahead", [("hang", 9, 141, 0), ("hang", 7, 794, 2),
                                                          ("missing_dump_hang", 8, 155, 0), ("size_mismatch", 6, 587, 2)])
def test_a_tp_fault_beside_a_ring_of_batched_steps_names_only_its_rank(tmp_path, kind, culprit, seed, lookahead):
    # The culprit's TP partner waits in the TP op before its next ring step, so its ring
    # neighbour waits for a send it never posted. Its ring steps came back to back, then a
    # TP op: nothing led up to a step, so its own past cannot say it went past this one
    # (before, it was named beside the culprit).
    synth_job = generate(16, tp=2, pp=4 if seed == 794 else 8, steps=3, ring=True, p2p="batched", timing=True,
                         lookahead=lookahead, seed=seed, fault=Fault(kind, rank=culprit, group="tp", step=1 + seed % 2),
                         **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    assert not [f for f in report["findings"] if f["root_cause"] and culprit ^ 1 in f["suspect_ranks"]]


def test_a_tp_device_stall_beside_a_ring_of_batched_steps_is_no_fault(tmp_path):
    # Both TP members are in the op: nothing says who stalled it. Before, the ring neighbour
    # of one of them was taken to have skipped a ring step (a FAULT on a tie of two ranks).
    synth_job = generate(16, tp=2, pp=8, steps=3, ring=True, p2p="batched", timing=True, seed=946,
                         fault=Fault("stuck", rank=11, group="tp", step=1), **FAITHFUL)
    assert synth_job.truth["status"] == "inconclusive"
    assert_truth(tmp_path, synth_job)


@pytest.mark.parametrize("kind, culprit, seed, lookahead", [("stuck", 13, 586, 0), ("stuck", 1, 960, 2),
                                                          ("hang", 14, 907, 0), ("missing_dump_hang", 2, 361, 0)])
def test_a_ring_of_batched_steps_in_only_active_dumps_pairs_its_steps_in_order(tmp_path, kind, culprit, seed, lookahead):
    # Batch ops never look finished, so only-active dumps keep every ring step; a rank one
    # step ahead of its neighbour (whose batch waits on its other end) had its finished
    # steps paired from the newest back, one off, and the sizes of forward and backward
    # steps then disagreed: a skipped step on ranks that skipped nothing (a FAULT where a
    # device stall cannot be told from a dump taken mid-op).
    synth_job = generate(16, tp=2, pp=8, steps=3, ring=True, p2p="batched", timing=True, only_active=True,
                         lookahead=lookahead, seed=seed, fault=Fault(kind, rank=culprit, group="tp", step=1 + seed % 2),
                         **FAITHFUL)
    report = assert_truth(tmp_path, synth_job)
    assert not [f for f in report["findings"] if f["rule"].startswith("p2p_sizes")]
    analysis, _ = analyse_dicts(dict(synth_job.dumps), render=False)
    pairs = [p for p in analysis.matches.p2p if p.send is not None and p.recv is not None]
    assert pairs and all(p.send.p2p_seq_id == p.recv.p2p_seq_id for p in pairs)  # a ring step's batch numbers agree


@pytest.mark.parametrize("p2p", ["plain", "batched"])
def test_a_healthy_ring_stays_healthy(tmp_path, p2p):
    assert_truth(tmp_path, generate(32, tp=2, pp=8, steps=3, ring=True, p2p=p2p, timing=True, lookahead=6))


# --------------------------------------------------------------------------- interleaved pipelines


@pytest.mark.parametrize("stage", [1, 5, 7])
@pytest.mark.parametrize("backward", [False, True])
def test_an_interleaved_pipeline_cascade_names_only_its_root(tmp_path, stage, backward):
    # 8 stages of 2 virtual chunks each (Megatron's interleaved 1F1B, every exchange a batch),
    # TP 2, DP 2: a TP rank stops issuing, and both pipelines of its replica stall behind it.
    culprit = 2 * stage + 1
    synth_job = generate(32, tp=2, pp=8, steps=2, vchunks=2, p2p="batched", timing=True, lookahead=4, **FAITHFUL,
                         fault=Fault("hang", rank=culprit, group="tp", step=1, last_op=backward))
    assert synth_job.truth["suspect_ranks"] == [culprit]
    assert_truth(tmp_path, synth_job)


@pytest.mark.parametrize("world, tp, pp, culprit, seed, lookahead", [(16, 2, 4, 6, 120, 0), (32, 2, 8, 15, 139, 0),
                                                                      (32, 2, 8, 18, 58, 2)])
def test_a_send_left_out_early_in_an_interleaved_pipeline_is_blamed_on_its_sender(tmp_path, world, tp, pp, culprit,
                                                                                   seed, lookahead):
    # The last stage leaves one send to the first stage out of a batch and goes on. Each of
    # its later sends on that channel pairs one step off, so the recv its partner waits in
    # has a match on the sender's like ranks and on the sender too; only its ops, counted
    # against its like ranks' (the TP partner's pipeline and the other replica), show the
    # skip. The partner's neighbour, which waits for the stalled partner, was blamed.
    # (Seed 58: the other replica got further, so its newest ops start past the skip; the
    # rank's are compared with more of theirs.)
    synth_job = generate(world, tp=tp, pp=pp, steps=3, vchunks=2, p2p="batched", timing=True, seed=seed,
                         lookahead=lookahead, **FAITHFUL,
                         fault=Fault("p2p_unmatched", rank=culprit, group="pp", step=1 + seed % 2))
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    root = next(f for f in report["findings"] if f["kind"] == "p2p_unmatched" and f["suspect_ranks"] == [culprit])
    assert "skipped it" in root["message"]


@pytest.mark.parametrize("world, pp, kind, group, culprit, seed, lookahead", [
    (32, 8, "stuck", "tp", 17, 937, 0), (32, 4, "p2p_unmatched", "pp", 22, 170, 2),
    (32, 8, "p2p_unmatched", "pp", 31, 986, 0)])
def test_an_only_active_interleaved_pipeline_pairs_its_batches_of_one_op_in_order(tmp_path, world, pp, kind, group,
                                                                                  culprit, seed, lookahead):
    # An interleaved pipeline's first and last exchanges are batches of one op. Only-active
    # dumps leave out a finished batch's marker, so such an op looked plain, and the channel
    # paired from its newest op back: one step off, a stalled pipeline read as a recv never
    # posted (a device stall in TP a FAULT on two pipeline ranks), and a send left out was
    # blamed on a neighbour. Its ops never left `scheduled`, as a batch's never do, and the
    # rank's numbers run whole: they are a batch, and the channel pairs in order, where the
    # like ranks' ops show the skip.
    synth_job = generate(world, tp=2, pp=pp, steps=3, vchunks=2, p2p="batched", timing=True, seed=seed,
                         lookahead=lookahead, only_active=True, **FAITHFUL,
                         fault=Fault(kind, rank=culprit, group=group, step=1 + seed % 2))
    assert synth_job.truth["suspect_ranks"] == ([] if kind == "stuck" else [culprit])
    assert_truth(tmp_path, synth_job)


@pytest.mark.parametrize("world, pp, culprit, seed, lookahead", [
    (16, 4, 3, 40, 0), (32, 8, 17, 442, 0),
    (16, 4, 11, 349, 2),  # by age alone, the next stage was named
])
def test_an_only_active_pipeline_circle_is_blamed_on_the_stage_whose_numbering_fell_behind(tmp_path, world, pp,
                                                                                           culprit, seed, lookahead):
    # A stage left a recv out, then waits in a later one; its pipeline's stages each wait
    # in a recv from the next, a circle in which every finding blames a neighbour and only
    # the ops' ages told them apart: the oldest blamed another stage. The TP partner's
    # pipeline plays the same program: there the culprit's like rank waits in the same recv
    # one number further on, while the peers both wait on stand alike. Its numbering fell
    # behind, so it left one out.
    synth_job = generate(world, tp=2, pp=pp, steps=3, vchunks=2, p2p="plain", timing=True, seed=seed,
                         lookahead=lookahead, only_active=True, **FAITHFUL,
                         fault=Fault("p2p_unmatched", rank=culprit, group="pp", step=1 + seed % 2))
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    root = next(f for f in report["findings"] if f["root_cause"] and f["suspect_ranks"])
    assert root["evidence"]["fell_behind"]["rank"] == culprit
    assert "deadlock_circle_ranks" not in root["evidence"]
    assert f"rank {culprit} left one op out" in root["message"]


@pytest.mark.parametrize("p2p", ["plain", "batched", "mixed"])
@pytest.mark.parametrize("fault", [None, Fault("in_flight", rank=1, group="dp", step=2)])
def test_only_active_interleaved_pipelines_of_plain_and_batched_ops_are_no_fault(tmp_path, p2p, fault):
    # Lone ops read as batches only where the rank posts batches and its numbers run whole:
    # a plain op still queued must not be paired as a batch against its partner's plain one.
    synth_job = generate(16, tp=2, pp=4, steps=3, vchunks=2, p2p=p2p, timing=True, lookahead=2, only_active=True,
                         fault=fault, **FAITHFUL)
    assert synth_job.truth["status"] != "faults"
    assert_truth(tmp_path, synth_job)


@pytest.mark.parametrize("p2p", ["plain", "batched"])
def test_a_healthy_interleaved_pipeline_stays_healthy(tmp_path, p2p):
    assert_truth(tmp_path, generate(32, tp=2, pp=8, steps=2, vchunks=2, p2p=p2p, timing=True, **FAITHFUL))


@pytest.mark.parametrize("seed, lookahead", [(0, 0), (1, 2), (0, 4)])
def test_a_healthy_pipeline_whose_buffer_kept_a_batch_marker_without_its_ops_stays_healthy(tmp_path, seed, lookahead):
    # A small ring buffer overwrote a P2P batch's ops and kept its end marker, the oldest
    # entry of the pipeline group: it carries the number of the group's last collective,
    # and compared as that collective it was an op mismatch with the peers' all_reduce
    # there (a FAULT on two ranks of a healthy job).
    synth_job = generate(16, tp=2, pp=8, steps=3, vchunks=2, p2p="batched", timing=True, buffer_size=150, seed=seed,
                         lookahead=lookahead, **FAITHFUL)
    report = assert_truth(tmp_path, synth_job)
    assert report["status"] == "healthy"


PIPELINE = {"0": ("default_pg", tuple(range(8))), "pp": ("pp", (0, 1, 2, 3)),
            "tp0": ("tp", (0, 4)), "tp1": ("tp", (1, 5)), "tp2": ("tp", (2, 6)), "tp3": ("tp", (3, 7))}


def _stalled_pipeline(stalled: bool) -> dict:
    """Four stages (ranks 0-3) with TP partners 4-7. Stalled: rank 3 stops before its second
    TP all_reduce (its partner 7 waits in it); rank 2 posted its send to rank 1 and its recv
    from rank 3, which never sends; rank 1 posted the recv that pairs with rank 2's send but
    cannot finish it while rank 2's ops hang together (its own send to rank 0 waits behind);
    rank 0 waits for that send. Else the same pipeline dumped mid-transfer: ranks 1 and 2
    have posted a send and its recv, nothing else is pending."""
    started, queued = {"state": "started"}, {"state": "scheduled"}
    steps = {rank: [f"all_reduce@tp{rank % 4}"] for rank in range(8)}
    steps[1] += [("recv 1<-2@pp", started)]
    steps[2] += [("send 2->1@pp", started)]
    if stalled:
        steps[0] += [("recv 0<-1@pp", started)]
        steps[1] += [("send 1->0@pp", queued)]
        steps[2] += [("recv 2<-3@pp", started)]
        steps[7] += [("all_reduce@tp3", started)]
    return job(steps, groups=PIPELINE)


def test_a_p2p_end_that_never_posted_because_it_waits_elsewhere_is_a_consequence(tmp_path):
    # Rank 1 never posted its send to rank 0 because it waits in a recv whose sender (rank 2)
    # is held up by rank 3: the root is rank 3, not rank 1.
    _, diagnosis = analyse_dicts(_stalled_pipeline(stalled=True))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,)), diagnosis.verdict
    to_rank_0 = next(f for f in diagnosis.findings if f.kind == "p2p_unmatched" and f.p2p_ends.missing_on == 1)
    assert not to_rank_0.is_root and to_rank_0.suspect_ranks == ()
    result = CliRunner().invoke(frtrace, [str(write_job(tmp_path / "d", _stalled_pipeline(stalled=True))), "--format", "json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["suspect_ranks"] == [3]


def test_a_pipeline_dumped_mid_transfer_stays_healthy(tmp_path):
    _, diagnosis = analyse_dicts(_stalled_pipeline(stalled=False))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("healthy", ()), diagnosis.verdict
    note = next(f for f in diagnosis.findings if f.rule == "p2p.posted_pair")
    assert (note.kind, note.severity, note.ranks) == ("in_flight", "info", (1, 2))


# --------------------------------------------------------------------------- rank-local pg ids


@pytest.mark.parametrize("culprit, group", [(6, "dp"), (7, "dp"), (9, "tp")])
@pytest.mark.parametrize("timing", [False, True])
def test_pg_status_is_read_under_the_ranks_own_pg_ids(tmp_path, culprit, group, timing):
    # Each rank created its groups in an order of its own (hashed names): a rank's pg_id for
    # a group is not its peers'. Only active entries: the culprit, which stopped issuing,
    # holds nothing; read under its peers' pg_id, its pg_status would be another group's.
    synth_job = generate(16, tp=4, pp=1, steps=4, only_active=True, pg_order="rotated", hashed_names=True,
                         timing=timing, watchdog_ms=100.0, pg_status="work",
                         fault=Fault("hang", rank=culprit, group=group, step=2 if group == "tp" else 1))
    assert synth_job.truth["suspect_ranks"] == [culprit]
    assert_truth(tmp_path, synth_job)


def test_groups_created_in_other_orders_stay_healthy(tmp_path):
    assert_truth(tmp_path, generate(16, tp=4, pp=1, steps=4, only_active=True, pg_order="rotated",
                                    hashed_names=True, timing=True, watchdog_ms=100.0, pg_status="work"))


# --------------------------------------------------------------------------- in-flight snapshots


@pytest.mark.parametrize("world, tp", [(32, 4), (256, 8)])
def test_a_job_dumped_while_every_rank_is_mid_collective_is_no_fault(tmp_path, world, tp):
    synth_job = generate(world, tp=tp, pp=1, steps=3, timing=True, lookahead=2, **FAITHFUL,
                         fault=Fault("in_flight", rank=0, group="dp", step=2))
    report = assert_truth(tmp_path, synth_job)
    assert report["summary"].startswith("INCONCLUSIVE: every rank is in flight in _all_gather_base")
    assert "cannot tell" in report["summary"]


@pytest.mark.parametrize("world, tp", [(32, 4), (64, 8)])
def test_notes_on_groups_in_flight_come_in_the_order_of_their_groups(world, tp):
    # One note per group in flight, each timed on its members' own clocks: read in the
    # order of their groups (the text report's sections follow it), not of those times.
    synth_job = generate(world, tp=tp, pp=1, steps=3, timing=True, lookahead=2, **FAITHFUL,
                         fault=Fault("in_flight", rank=0, group="dp", step=2))
    _, diagnosis = analyse_dicts(dict(synth_job.dumps), render=False)
    noted = [f.group_id for f in diagnosis.findings if f.severity == "info" and f.kind == "in_flight"]
    assert len(noted) > 2 and noted == sorted(noted)


@pytest.mark.parametrize("world, tp, steps, seed, order, rank", [
    (16, 4, 5, 461, "same", 9),
    (8, 2, 2, 823, "rotated", 5),
])
def test_a_rank_in_an_op_its_whole_group_is_in_has_not_skipped_what_comes_after(world, tp, steps, seed, order, rank):
    """An interleaved pipeline dumped while every TP group is in one collective, with ring
    buffers of 30 entries: the first stage's ranks are in it, and the next stage waits for
    the send that comes after it. The few steps a 30-entry buffer keeps are the end of the
    pipeline's schedule, where backward receives follow without forward sends: read as the
    rank's own past, they said it skipped the send (a FAULT naming every first-stage rank)."""
    job = generate(world, tp, 2, steps=steps, timing=True, p2p="batched", seed=seed, pg_order=order,
                   coalesced_events="marker", bubble_ms=100.0, buffer_size=30, vchunks=2,
                   fault=Fault("in_flight", rank=rank, group="tp", step=1))
    assert job.truth["status"] == "inconclusive"
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    assert not any(f.facts.get("went_past") for f in diagnosis.findings)

def test_the_same_op_past_its_timeout_is_a_hang(tmp_path):
    # The hosts queued more ops long enough after it (the timeout is 1 ms here): the dumps
    # show it outlived its timeout, so it is stuck, not in flight.
    synth_job = generate(32, tp=4, pp=1, steps=3, timing=True, lookahead=4, timeout_ms=1,
                         fault=Fault("in_flight", rank=0, group="tp", step=2))
    assert synth_job.truth["status"] == "faults" and synth_job.truth["fault_kind"] == "stuck"
    assert_truth(tmp_path, synth_job)


# --------------------------------------------------------------------------- one TP pair per stage


@pytest.mark.parametrize("world, pp, p2p, seed, culprit, step, lookahead, buffer", [
    (8, 4, "plain", 28, 7, 1, 4, 2000), (16, 8, "batched", 53, 14, 2, 0, 2000), (16, 8, "mixed", 56, 14, 1, 0, 150)])
def test_a_tp_skip_with_one_tp_pair_per_stage_names_the_rank_that_skipped(tmp_path, world, pp, p2p, seed, culprit,
                                                                           step, lookahead, buffer):
    # TP 2, one replica, timing off: the pair splits one against one, and the rank that
    # skipped waits in the next stage op (an all_reduce of the pipeline group its peers
    # there have not reached), which waits round a circle back to its partner: the same
    # two splits as the partner going ahead. Its own earlier step shows the op came right
    # after the TP op it issued last, and went on as it goes on now: it skipped it (the
    # partner was named before).
    synth_job = generate(world, tp=2, pp=pp, steps=3, p2p=p2p, timing=False, lookahead=lookahead, buffer_size=buffer,
                         seed=seed, fault=Fault("skip_op", rank=culprit, group="tp", step=step), **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    root = next(f for f in report["findings"] if f["root_cause"] and f["suspect_ranks"])
    assert root["rule"] == "divergence.never_issued" and str(culprit) in root["evidence"]["went_past"]


@pytest.mark.parametrize("world, pp, p2p, seed, lookahead", [(8, 4, "plain", 28, 4), (16, 8, "batched", 53, 0)])
def test_its_healthy_twin_stays_healthy(tmp_path, world, pp, p2p, seed, lookahead):
    synth_job = generate(world, tp=2, pp=pp, steps=3, p2p=p2p, timing=False, lookahead=lookahead, seed=seed, **FAITHFUL)
    assert_truth(tmp_path, synth_job)


def test_an_only_active_tp_skip_circle_names_the_rank_blamed_in_two_groups(tmp_path):
    # Only active entries, TP 2 x PP 2 x DP 4: rank 10 skips a TP all_reduce and goes on to
    # the pipeline group's all_reduce, ahead of its stage partner there; its TP partner 11
    # waits for it, so 11 posts neither end of its P2P pair with rank 9, which waits round
    # to rank 8, which waits for 10. Rank 10 is blamed in two groups (TP and PP); rank 11 in
    # one, twice (both ends of one pair): the circle's root is rank 10's.
    synth_job = generate(16, tp=2, pp=2, steps=3, p2p="batched", timing=True, lookahead=0, only_active=True, seed=49,
                         fault=Fault("skip_op", rank=10, group="tp", step=1), **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == [10]
    report = assert_truth(tmp_path, synth_job)
    # Decided by what the findings blame, not by age: no circle to own up to.
    assert not any("deadlock_circle_ranks" in f["evidence"] for f in report["findings"])
    assert "deadlock_circle_by_age" not in report["suspect_confidence"][0]["evidence"]


@pytest.mark.parametrize("world,tp,pp,culprit,seed,lookahead,named", [
    # One pipeline: no like rank elsewhere shows whose numbering fell behind.
    (8, 1, 8, 1, 137, 2, 4),  # the oldest op is another stage's: another rank of the circle is named
    (8, 1, 8, 7, 120, 2, 7),  # the oldest op is the culprit's
])
def test_a_deadlock_circle_told_apart_only_by_age_says_so(tmp_path, world, tp, pp, culprit, seed, lookahead, named):
    """Only-active dumps of an interleaved pipeline with plain sends and recvs: the finished
    P2P ops are left out, so a send never posted leaves the stages waiting on each other in
    a circle whose findings blame one rank each, alike. The oldest op names the root, and the
    report says that any rank of the circle may have started it, below the 0.70 of an unmatched P2P op."""
    synth_job = generate(world, tp=tp, pp=pp, steps=3, p2p="plain", timing=True, lookahead=lookahead, only_active=True,
                         seed=seed, vchunks=2, fault=Fault("p2p_unmatched", rank=culprit, group="pp", step=1 + seed % 2),
                         **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == [culprit]
    status, suspects, code, report = verdict(tmp_path, synth_job)
    assert (status, suspects, code) == ("faults", [named], 1)
    root = next(f for f in report["findings"] if f["root_cause"])
    circle = root["evidence"]["deadlock_circle_ranks"]
    assert culprit in circle and named in circle and len(circle) == pp
    assert "wait on each other in a circle" in report["summary"] and "any of those ranks may have started it" in report["summary"]
    confidence = report["suspect_confidence"][0]
    assert "deadlock_circle_by_age" in confidence["evidence"] and confidence["confidence"] < 0.7


@pytest.mark.parametrize("culprit, group, seed, lookahead, p2p, order", [
    (9, "dp", 535, 0, "mixed", "same"),
    (14, "pp", 941, 2, "mixed", "rotated"),
])
def test_a_circle_of_stage_neighbours_names_the_rank_whose_gpu_shows_it_stopped(tmp_path, culprit, group, seed,
                                                                                  lookahead, p2p, order):
    """Only-active dumps of a PP 8 x DP 2 pipeline (TP 1): a rank's GPU stops completing
    work. It and its stage neighbour wait on each other's sends and recvs, one pair of
    ranks blamed alike; only the stalled rank holds an op of another group unfinished that
    its peer there finished. That tells the root where the findings alone are alike."""
    synth_job = generate(16, tp=1, pp=8, steps=3, p2p=p2p, timing=order == "same", lookahead=lookahead, only_active=True,
                         seed=seed, pg_order=order, hashed_names=order == "rotated",
                         fault=Fault("gpu_error", rank=culprit, group=group, step=1 + seed % 2), **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == [culprit]
    report = assert_truth(tmp_path, synth_job)
    held = [f for f in report["findings"] if f["rule"] == "frontier.dumped_at_other_moments"]
    assert any(f["evidence"]["holding_ranks"] == [culprit] for f in held)


# --------------------------------------------------------------------------- two-member mismatches, no sibling there

@pytest.mark.parametrize("pp,kind,culprit,step,seed,timing,lookahead,p2p,buffer_size", [
    (4, "op_mismatch", 1, 1, 25, True, 4, "plain", 2000),
    (2, "size_mismatch", 0, 2, 345, True, 0, "plain", 80),
    (4, "dtype_mismatch", 1, 1, 400, True, 2, "mixed", 60),
    (4, "op_mismatch", 0, 2, 593, False, 0, "batched", 60),
    (4, "size_mismatch", 1, 2, 361, True, 0, "batched", 2000),
])
def test_a_tp_pair_mismatch_no_sibling_reached_is_decided_by_the_groups_own_past(
        tmp_path, pp, kind, culprit, step, seed, timing, lookahead, p2p, buffer_size):
    """TP 2 x PP x DP 1: one TP pair per pipeline stage, so when a pair splits one against one
    the other pairs, stalled behind it, never reached the op to vote. The pair's own earlier
    steps issued the right op and never the wrong one: the rank that issued what the group
    never ran is named, with that said in the message."""
    synth_job = generate(2 * pp, 2, pp, steps=3, fault=Fault(kind, rank=culprit, group="tp", step=step), seed=seed,
                         timing=timing, lookahead=lookahead, p2p=p2p, buffer_size=buffer_size, **FAITHFUL)
    report = assert_truth(tmp_path, synth_job)
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["rule"] == "divergence.mismatch" and root["evidence"]["tie_broken_by_own_past"] >= 2
    assert "the group issued" in root["message"] and "never" in root["message"]
    assert [c["rank"] for c in report["suspect_confidence"]] == [culprit]


def _pair_with_past(history: list, last: dict) -> dict:
    """Ranks 0 and 1, alone in their group: `history` issued alike, then each its own op in `last`."""
    return job({rank: history + [last[rank]] for rank in (0, 1)})


SMALL, LARGE = ("all_reduce", {"sizes": ((16,),)}), ("all_reduce", {"sizes": ((32,),)})


def test_a_pair_whose_past_ran_only_one_camps_op_twice_names_the_other():
    _, diagnosis = analyse_dicts(_pair_with_past([SMALL, SMALL], {0: LARGE, 1: SMALL}))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (0,))


@pytest.mark.parametrize("history", [
    [SMALL],  # once: a one-off op as well as a program's
    [SMALL, LARGE, SMALL, LARGE],  # both camps' ops ran before: the program uses both
    [],  # nothing before
])
def test_a_pair_whose_past_cannot_tell_stays_a_tie(history):
    _, diagnosis = analyse_dicts(_pair_with_past(history, {0: LARGE, 1: SMALL}))
    tie = next(f for f in diagnosis.findings if f.is_root)
    assert (tie.rule, diagnosis.suspect_ranks) == ("divergence.mismatch_tie", (0, 1))
    assert "tie_broken_by_own_past" not in tie.evidence


def test_a_pair_whose_past_is_past_the_diagnosis_budget_stays_a_tie(monkeypatch):
    """The earlier ops one diagnosis reads for this are bounded (thousands of pairs may split
    at once); a group whose whole window no longer fits is not judged on a part of it."""
    import frtrace.diagnosis.divergence as divergence

    dumps = _pair_with_past([SMALL, SMALL, SMALL], {0: LARGE, 1: SMALL})
    monkeypatch.setattr(divergence, "OWN_PAST_BUDGET", 3)
    assert analyse_dicts(dumps)[1].suspect_ranks == (0,)
    monkeypatch.setattr(divergence, "OWN_PAST_BUDGET", 2)
    assert analyse_dicts(dumps)[1].suspect_ranks == (0, 1)


def test_a_ring_cut_inside_a_coalesced_batch_is_no_mismatch():
    # Each rank's ring buffer wraps at its own point. Rank 7's oldest record is the second
    # op of a coalesced batch of reduce_scatters: the batch lost its first op, and read as
    # it stands it differed from its peers' whole batch, a FAULT on a healthy job.
    job = generate(16, 2, 2, steps=3, seed=1, timing=True, p2p="plain", coalesced_events="marker",
                   watchdog_ms=100.0, pg_status="work")
    dumps = dict(job.dumps)
    entries = dumps[7]["entries"]
    marker = next(i for i, e in enumerate(entries) if e["profiling_name"].endswith(":coalesced") and not e["is_p2p"]
                  and sum(1 for o in entries[:i] if o["collective_seq_id"] == e["collective_seq_id"]
                          and o["process_group"] == e["process_group"] and not o["is_p2p"]) >= 2)
    batch = [i for i in range(marker) if entries[i]["collective_seq_id"] == entries[marker]["collective_seq_id"]
             and entries[i]["process_group"] == entries[marker]["process_group"]]
    dumps[7] = dict(dumps[7], entries=entries[batch[1]:])
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == (job.truth["status"], ()) == ("healthy", ())


def _newest_p2p_send_left_out(culprit: int) -> dict:
    """An interleaved pipeline (TP 2 x PP 4 x DP 2, two model chunks, batched P2P) in
    which `culprit` leaves out its newest send to the stage before it and goes on: that
    stage then waits in a batch that also sends to the stage before it, and the culprit
    in the pipeline group's next collective (skip_p2p_at cuts every rank)."""
    from frtrace.testing.inject import Layout, group_ranks, skip_p2p_at

    healthy = generate(16, 2, 4, steps=3, seed=5, p2p="batched", coalesced_events="marker", pg_status="work",
                       watchdog_ms=100.0, vchunks=2)
    named = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    units = Layout(named, group_ranks(named)).units[culprit]
    newest = max(u for u, (_, _, keys) in enumerate(units) if keys and keys[0][0] == "P")
    dumps, what = skip_p2p_at(named, culprit, newest)
    assert what["kind"] == "p2pskip"
    return {rank: dump for rank, (_, dump) in dumps.items()}


def test_a_send_left_out_is_found_by_the_like_ranks_of_the_batch_op_that_waits_for_it():
    # The waiting batch's first op is its send to the stage before; the like ranks were
    # asked about that op's partner, not the recv's, found none, and the stage before,
    # waiting for a send of the blocked batch's rank, was blamed.
    _, diagnosis = analyse_dicts(_newest_p2p_send_left_out(12), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (12,))


def _step_left_out(p2p: str, seed: int, culprit: int, group: str, number: int) -> dict:
    """An interleaved pipeline (TP 2 x PP 4 x DP 2, two model chunks) in which `culprit`
    leaves out its P2P op or batch numbered `number` in pipeline group `group` and goes
    on: its later ops pair by their place in the program (as the independent generators
    write a skipped ring step), so it waits with a neighbour in a pair both posted, while
    the partner of the step it left out waits for it."""
    from frtrace.testing.inject import Layout, group_ranks, skip_p2p_at

    healthy = generate(16, 2, 4, steps=3, seed=seed, p2p=p2p, coalesced_events="marker", pg_status="work",
                       watchdog_ms=100.0, vchunks=2)
    named = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    entries = named[culprit][1]["entries"]
    unit = next(u for u, (first, _, keys) in enumerate(Layout(named, group_ranks(named)).units[culprit])
                if keys and keys[0][0] == "P" and entries[first]["process_group"][0] == group
                and entries[first]["p2p_seq_id"] == number)
    dumps, _ = skip_p2p_at(named, culprit, unit)
    return {rank: dump for rank, (_, dump) in dumps.items()}


@pytest.mark.parametrize("p2p, seed, culprit, group, number", [
    ("batched", 2, 2, "9", 28),  # a batch left out
    ("plain", 2, 2, "9", 37),  # a plain op left out
    ("plain", 3, 15, "12", 19),
])
def test_a_pipeline_step_left_out_is_named_by_the_like_ranks_of_the_posted_pair(p2p, seed, culprit, group, number):
    # The pair the culprit went on to is posted on both ends and waits on no one else: it
    # read as a transfer in flight (inconclusive); the stage's ranks in the other
    # pipelines show the step it left out.
    _, diagnosis = analyse_dicts(_step_left_out(p2p, seed, culprit, group, number), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (culprit,))
    root = next(f for f in diagnosis.findings if f.is_root)
    assert root.rule == "p2p.left_out_step" and root.p2p_ends is not None and culprit in root.p2p_ends[:2]


def test_a_channel_s_plain_pair_still_posted_is_read_beside_its_finished_batched_pairs():
    # Plain pairs come first in a channel's pairs, batched ones after: the waits read the
    # newest pairs back to a finished one, and met the batched ones' first, so a posted
    # plain pair was never read and its ranks were blamed for the collectives they were
    # kept from (5 and 7; now 5 alone).
    _, diagnosis = analyse_dicts(_step_left_out("mixed", 3, 5, "10", 36), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (5,))


def test_a_step_left_out_outweighs_the_unmatched_op_of_the_pair_it_waits_in():
    # Two stages, each batching a send to and a recv from the other (TP 2 x PP 2, two
    # chunks): rank 0 leaves out a step, and its next batch's recv pairs with the peer's
    # send for that step, posted on both ends, while its send waits for a recv the peer
    # never reaches. The unmatched send named the peer, rank 2, beside the left-out step.
    from frtrace.testing.inject import skip_p2p_at

    healthy = generate(8, 2, 2, steps=3, seed=1, p2p="batched", coalesced_events="marker", pg_status="work",
                       watchdog_ms=100.0, vchunks=2)
    dumps, what = skip_p2p_at({rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}, 0, 43)
    assert (what["group"], what["seq"]) == ("5", 13)
    _, diagnosis = analyse_dicts({rank: dump for rank, (_, dump) in dumps.items()}, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (0,))
    assert next(f for f in diagnosis.findings if f.is_root).rule == "p2p.left_out_step"


def test_a_stage_that_posted_its_newest_batch_short_of_one_op_is_named():
    # An interleaved pipeline (8 ranks, PP 4, two chunks, batched sends and recvs), healthy,
    # then rank 7 leaves out its recv from rank 4 in batch #25 of the pipeline group, its
    # later ops paired by their place in the program (tools/inject_faults.py's p2pstep). It
    # waits in that batch's send with rank 6, which waits back: a cycle of pairs posted on
    # both ends, read as a transfer in flight. Its like rank (rank 3) posted the recv in
    # its batch #25.
    import random

    from frtrace.testing.inject import inject

    job = generate(world_size=8, tp=1, pp=4, vchunks=2, p2p="batched", steps=3, timing=True, seed=5, **FAITHFUL)
    dumps = {rank: (f"rank_{rank}", job.dumps[rank]) for rank in range(8)}
    rng = random.Random(7)
    for _ in range(4):
        injected = inject(dumps, "p2pstep", rng)
    assert injected is not None
    faulty, what = injected
    assert (what["culprit"], what["kind"]) == (7, "p2pstep")
    _, diagnosis = analyse_dicts({rank: dump for rank, (_, dump) in faulty.items()}, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (7,))
    (finding,) = [f for f in diagnosis.findings if f.rule == "p2p.left_out_step"]
    assert finding.evidence["skipped_p2p_ops"] == 1
    # It went on to nothing after the op: it posted the batch's other op without it.
    assert "rank 7 posted send p2p #25 in group 10 (pp) without it" in finding.message
    assert "went on to" not in finding.message


def test_a_finished_send_whose_number_meets_an_unfinished_collectives_is_no_proof_it_finished():
    # A pipeline group runs batched sends and recvs and an all_reduce. pg_status keeps the
    # number of the group's last finished work, a P2P number after a batch: here rank 5's
    # row says 2 finished, its batch #2, while its dump holds all_reduce #2 started. Read as
    # a collective number it said rank 5 finished #2, so that rank 7, whose dump is lost
    # and who never issued #2, "took part"; rank 5 was then blamed for a dp op it queued.
    job = generate(world_size=16, tp=2, pp=2, steps=3, timing=True, p2p="batched", seed=766, lookahead=2,
                   buffer_size=60, fault=Fault("missing_dump_hang", rank=7, group="pp", step=1), **FAITHFUL)
    status = job.dumps[5]["pg_status"]["2"]
    held = [e for e in job.dumps[5]["entries"] if e["process_group"][1] == "pp" and not e["is_p2p"]
            and e["profiling_name"].endswith("all_reduce")]
    assert status["last_completed_collective"] == held[-1]["collective_seq_id"] == 2 and held[-1]["state"] == "started"
    analysis, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (7,))
    root = next(f for f in diagnosis.findings if f.is_root)
    assert root.kind == "missing_dump" and root.collective_seq_id == 2
    view = next(v for v in analysis.matches.views if v.group.desc == "pp" and 5 in v.group.ranks)
    assert view.streams[5].finished is None


# --------------------------------------------------------------------------- two hosts that stop at once

@pytest.mark.parametrize("world, tp, pp, group, first, other, step, p2p, only_active, order, seed", [
    (16, 2, 4, "pp", 12, 6, 2, "batched", True, "rotated", 253),
    (16, 4, 2, "dp", 12, 1, 1, "batched", False, "same", 408),
    (16, 2, 4, "dp", 10, 5, 2, "plain", True, "same", 571),
])
def test_two_hosts_that_stop_at_once_are_named_and_the_ranks_stuck_behind_them_are_not(
        tmp_path, world, tp, pp, group, first, other, step, p2p, only_active, order, seed):
    """NVRx's LOCK_GIL stops two hosts at one moment, wherever each is. The job-wide op
    neither issued is then missing on many ranks: the two, and ranks stuck behind them in
    other groups' ops. Those wait somewhere, so their own ops tell their story; only the
    ranks that wait nowhere are blamed for it."""
    synth_job = generate(world, tp, pp, steps=4, timing=True, p2p=p2p, only_active=only_active, seed=seed,
                         pg_order=order, hashed_names=order == "rotated",
                         fault=Fault("hang", rank=first, group=group, step=step, ranks=(first, other), at_once=True),
                         **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == sorted((first, other))
    report = assert_truth(tmp_path, synth_job)
    narrowed = [f for f in report["findings"] if f["root_cause"] and "held_elsewhere" in f["evidence"]]
    assert narrowed and all(set(f["suspect_ranks"]) <= {first, other} for f in narrowed)
    assert all(set(f["evidence"]["held_elsewhere"]).isdisjoint(f["suspect_ranks"]) for f in narrowed)
    # Its peers' agreement was against every rank absent from the op, victims included: a
    # suspect it names rests on waiting on no one, not on that agreement.
    places = {(f["pg_name"], f["collective_seq_id"]) for f in narrowed}
    rests_on = [c["evidence"][0] for c in report["suspect_confidence"]
                if (c["finding"]["pg_name"], c["finding"]["collective_seq_id"]) in places]
    assert rests_on and not {"unanimous_peers", "majority_of_peers", "one_peer"} & set(rests_on), rests_on


def test_ranks_that_wait_elsewhere_for_others_are_behind_not_outpaced_by_the_few_that_issued_the_op():
    # A healthy TP 2 x PP 8 x DP 2 job, then two GPUs stop at one moment
    # (frtrace.testing.inject.inject_at_once, as NVRx injects them): rank 9's at TP
    # all_gather #17, rank 26's wherever it then is. In DP groups many ranks stuck behind
    # either never reach an op a few issued; those wait in other ops, on others than the
    # few, so they are behind, not left behind by ranks gone ahead.
    # (The injector once stopped rank 10's GPU at #19 after it had finished an op that a
    # rank held up by rank 9 never reached, a state no job is in: it now refuses that.)
    from frtrace.testing.inject import inject_at_once

    healthy = generate(32, 2, 8, steps=4, timing=True, p2p="batched", seed=2, **FAITHFUL)
    named = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    assert inject_at_once(named, "gpu", "5", 19, (9, 10)) is None
    injected = inject_at_once(named, "gpu", "5", 17, (9, 26))
    assert injected is not None
    dumps, what = injected
    assert what["culprits"] == [9, 26]
    _, diagnosis = analyse_dicts({rank: dump for rank, (_, dump) in dumps.items()}, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (9, 26))
    assert not [f for f in diagnosis.findings if f.kind == "extra_op" and f.is_root]


def test_two_hosts_stopped_at_once_leave_no_collective_finished_that_a_member_never_issued():
    # The injector the sweeps use (frtrace.testing.inject, two hosts that stop issuing at
    # one moment): a second culprit whose last op was one the first never issued held it
    # finished, a state no job can be in, which read as healthy or made it stand out.
    import random

    from frtrace.testing.inject import group_ranks, inject

    healthy = generate(16, 2, 2, steps=4, timing=True, p2p="batched", seed=3, **FAITHFUL)
    job = {rank: (f"rank_{rank}", dump) for rank, dump in dict(healthy.dumps).items()}
    members = group_ranks(job)
    rng = random.Random(5)
    for _ in range(40):
        injected = inject(job, "hang2", rng)
        if injected is None:
            continue
        dumps, what = injected
        held: dict[tuple[int, str], set[int]] = {}
        for rank, (_, dump) in dumps.items():
            for entry in dump["entries"]:
                if not entry["is_p2p"]:
                    held.setdefault((rank, entry["process_group"][0]), set()).add(entry["collective_seq_id"])
        for rank, (_, dump) in dumps.items():
            for entry in dump["entries"]:
                group, seq = entry["process_group"][0], entry["collective_seq_id"]
                if entry["is_p2p"] or entry["state"] != "completed":
                    continue
                for member in members[group]:
                    theirs = held.get((member, group), set())
                    # Held, or older than all it holds (fallen off its ring buffer).
                    assert seq in theirs or (theirs and seq < min(theirs)), (what, rank, group, seq, member)


# --------------------------------------------------------------------------- GPUs that stop at once

@pytest.mark.parametrize("group, first, other, seed", [("tp", 9, 10, 265), ("pp", 4, 7, 459)])
def test_a_peer_of_stopped_gpus_that_went_on_in_a_pipeline_group_is_not_read_as_skipping_its_collective(
        group, first, other, seed):
    """Two GPUs stop at once (NVRx's GPU_ERROR) in a TP 2 x PP 2 job whose pipeline groups
    also run an all_reduce, dumped with only active entries. One stopped rank holds the
    pipeline group's all_reduce started; its partner holds nothing of the group and waits
    further on. The partner's row of the group counts sends and recvs too, so nothing says
    how far it got: it may have finished the all_reduce before the other's GPU stopped, as
    peers of a stopped GPU do. Its going on was read as skipping the op, and the partner,
    who did nothing wrong, was blamed beside the two."""
    synth_job = generate(16, 2, 2, steps=4, timing=True, p2p="plain", only_active=True, seed=seed,
                         fault=Fault("gpu_error", rank=first, group=group, step=2, ranks=(first, other), at_once=True),
                         **FAITHFUL)
    assert synth_job.truth["suspect_ranks"] == sorted((first, other))
    _, diagnosis = analyse_dicts(dict(synth_job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", tuple(sorted((first, other))))
    stalls = [f for f in diagnosis.findings if f.is_root and f.kind == "stuck"]
    assert {rank for f in stalls for rank in f.suspect_ranks} == {first, other}
    in_pipeline = [f for f in diagnosis.findings if f.pg_desc == "pp" and f.kind == "not_issued"]
    assert in_pipeline and not any(f.went_past for f in in_pipeline)
