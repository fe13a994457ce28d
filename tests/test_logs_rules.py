"""The `logs.*` rules: the rank (or honest "cannot tell") behind a job's logs, for faults
written in every torch version's wording and every layout, and for the shapes the
generator does not make."""

import pytest

from frtrace.diagnosis.logs import diagnose_logs, inferred_members
from frtrace.logs import read_logs
from frtrace.testing.joblogs import ERAS, job_logs, write_job_logs

FAULTS = ("never_arrives", "crash", "op_mismatch", "size_mismatch", "stuck", "healthy", "missing_log")
LAYOUTS = ("combined", "per_rank", "slurm", "per_node")


def diagnose_job(tmp_path, **kwargs):
    job = job_logs(**kwargs)
    return diagnose_logs(read_logs([write_job_logs(job, tmp_path / "logs")])), job.truth


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("era", ERAS)
def test_each_fault_in_each_era_names_the_culprit_or_says_it_cannot(tmp_path, fault, era):
    if era == "1.9" and fault in ("op_mismatch", "size_mismatch"):
        pytest.skip("torch 1.9 printed no sequence number: nothing lines the ops up")
    culprits = () if fault in ("stuck", "healthy") else (3, 12)
    for layout in LAYOUTS if fault != "missing_log" else ("per_rank",):
        diagnosis, truth = diagnose_job(tmp_path / layout, world=16, era=era, fault=fault, culprits=culprits,
                                        layout=layout, garble=layout == "combined", seed=len(layout))
        assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (truth["status"], truth["suspects"]), (layout, diagnosis.verdict)


def test_the_rules_and_kinds_behind_each_fault(tmp_path):
    expected = {"never_arrives": ("not_issued", "logs.never_reached"), "crash": ("crashed", "logs.crashed"),
                "op_mismatch": ("op_mismatch", "logs.mismatch"), "size_mismatch": ("size_mismatch", "logs.mismatch"),
                "missing_log": ("missing_log", "logs.no_log"), "stuck": ("stuck", "logs.all_waited")}
    for fault, (kind, rule) in expected.items():
        culprits = () if fault == "stuck" else (5,)
        diagnosis, _ = diagnose_job(tmp_path / fault, world=8, era="2.6", fault=fault, culprits=culprits,
                                    layout="per_rank")
        first = diagnosis.findings[0]
        assert (first.kind, first.rule) == (kind, rule), diagnosis.verdict
    silent, _ = diagnose_job(tmp_path / "silent", world=8, era="2.2", fault="never_arrives", culprits=(5,))
    assert (silent.findings[0].kind, silent.findings[0].rule) == ("not_issued", "logs.silent")


def test_a_generated_1024_rank_job(tmp_path):
    diagnosis, truth = diagnose_job(tmp_path, world=1024, era="2.6", fault="never_arrives", culprits=(517,),
                                    layout="per_node", noise=2)
    assert diagnosis.status == "faults" and list(diagnosis.suspect_ranks) == [517]
    assert diagnosis.findings[0].facts["suspect_hosts"] == {"517": "node65"}
    assert "drain" not in diagnosis.verdict and "rank 517 on node65" in diagnosis.verdict


# --------------------------------------------------------------------------- hand-written shapes

HEAD = "[rank{r}]:[E321 02:{m:02d}:{s:02d}.000000000 ProcessGroupNCCL.cpp:607] "


def timeout(rank, seq, op="ALLREDUCE", numel=8, pg="[PG ID 0 PG GUID 0(default_pg) Rank {local}]", local=None,
            minute=17, second=8, enq=None, done=None):
    local = rank if local is None else local
    head = HEAD.format(r=rank, m=minute, s=second)
    lines = [head + f"[Rank {local}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
             f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."]
    lines.append(head + pg.format(local=local) + f"  failure detected by watchdog at work sequence id: {seq} PG status: "
                 f"last enqueued work: {enq if enq is not None else seq}, last completed work: {done if done is not None else seq - 1}")
    return lines


def told(rank, enq, local=None, pg="[PG ID 0 PG GUID 0(default_pg) Rank {local}]", minute=17):
    local = rank if local is None else local
    return [HEAD.format(r=rank, m=minute, s=9) + pg.format(local=local) + "Received a dump signal due to a collective "
            f"timeout from  rank 0 and we will try our best to dump the debug info. Last enqueued NCCL work: {enq}, last "
            f"completed NCCL work: {enq}.This is most likely caused by incorrect usages of collectives"]


def diagnose_lines(tmp_path, lines, name="job.log", world_size=None):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return diagnose_logs(read_logs([path], world_size=world_size))


def test_the_issue_s_example_a_subgroup_whose_absent_members_follow_from_group_ranks(tmp_path):
    pg = "[PG 1 Rank {local}] "
    lines = []
    for rank in (0, 3, 4):
        lines += [HEAD.format(r=rank, m=7, s=8) + f"[Rank {rank}] Watchdog caught collective operation timeout: "
                  "WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran "
                  "for 600060 milliseconds before timing out.",
                  HEAD.format(r=rank, m=7, s=8) + pg.format(local=rank) + "Exception (either an error or timeout) detected "
                  "by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579."]
    lines += ["[rank1]: loss 1.23", "[rank2]: loss 1.25"]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (1, 2)
    assert "never reached" in diagnosis.verdict or "logged nothing" in diagnosis.verdict


def test_a_tensor_parallel_hang_blames_the_stuck_rank_and_links_the_data_parallel_wait(tmp_path):
    tp = "[PG ID 2 PG GUID 2(tp) Rank {local}]"
    lines = []
    for rank, local in ((4, 0), (6, 2), (7, 3)):
        lines += timeout(rank, 100, pg=tp, local=local, minute=10)
    for rank in (0, 1, 2, 3):
        lines += timeout(rank, 50, minute=17)
    lines += ["[rank5]: loss 1.0"]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (5,)
    blocked = [f for f in diagnosis.findings if f.rule == "logs.blocked_elsewhere"]
    assert blocked and not blocked[0].is_root and blocked[0].suspect_ranks == ()
    assert inferred_members({0: 4, 2: 6, 3: 7}) == {1: 5}


def test_a_member_whose_global_rank_cannot_be_told_is_said_so(tmp_path):
    tp = "[PG ID 2 PG GUID 2(tp) Rank {local}]"
    lines = timeout(9, 100, pg=tp, local=0) + timeout(12, 100, pg=tp, local=2) + ["[rank3]: hi"]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "inconclusive" and diagnosis.suspect_ranks == ()
    assert "group rank 1" in diagnosis.verdict


def test_an_even_split_is_a_tie_the_logs_cannot_break(tmp_path):
    lines = timeout(0, 7, op="BROADCAST") + timeout(1, 7, op="ALLREDUCE")
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "inconclusive" and diagnosis.suspect_ranks == ()
    assert diagnosis.findings[0].kind == "op_mismatch" and diagnosis.findings[0].facts["tie"]


def test_uneven_ops_are_no_size_mismatch(tmp_path):
    lines = timeout(0, 7, op="ALLTOALL_BASE", numel=8) + timeout(1, 7, op="ALLTOALL_BASE", numel=24)
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "inconclusive" and diagnosis.findings[0].kind == "stuck"


def test_nccl_warnings_on_some_ranks_single_them_out_when_everyone_waited(tmp_path):
    lines = timeout(0, 7) + timeout(1, 7) + timeout(2, 7)
    lines += ["[rank2]:node03:4242:4300 [2] NCCL WARN NET/IB : Got completion from peer 10.0.0.9<45123> with error 12"]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (2,)
    assert diagnosis.findings[0].facts["suspect_hosts"] == {"2": "node03"}


def test_a_rank_told_to_dump_that_had_enqueued_the_op_is_no_suspect(tmp_path):
    lines = timeout(0, 7) + timeout(1, 7) + told(2, 7) + told(3, 6)
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.suspect_ranks == (3,)
    assert diagnosis.findings[0].facts["last_enqueued"] == {"3": 6}


def test_a_rank_that_entered_the_op_after_its_peers_gave_up_was_behind(tmp_path):
    lines = timeout(0, 7, minute=17, second=8) + timeout(1, 7, minute=17, second=8) + timeout(2, 7, minute=29, second=40)
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.suspect_ranks == (2,) and diagnosis.findings[0].facts.get("entered_late")


def test_an_exception_after_the_timeout_is_no_root(tmp_path):
    lines = timeout(0, 7) + timeout(1, 7) + timeout(2, 7)
    lines += ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 1, in <module>',
              "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered"]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "inconclusive" and not [f for f in diagnosis.findings if f.kind == "crashed"]


def test_the_first_rank_to_fail_in_time_is_the_root(tmp_path):
    lines = ["[rank3]:[E321 02:07:01.000000000 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 3] note",
             "[rank3]: Traceback (most recent call last):", "[rank3]: AssertionError: loss is nan"]
    lines += timeout(0, 7) + timeout(1, 7) + timeout(2, 7)
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (3,)
    assert diagnosis.findings[0].kind == "crashed" and "AssertionError" in diagnosis.verdict


def test_a_rank_killed_by_the_oom_killer_per_the_launcher(tmp_path):
    lines = timeout(0, 7) + timeout(1, 7) + timeout(3, 7)
    lines += ["Root Cause (first observed failure):", "[0]:", "  time      : 2024-03-21_02:07:09", "  host      : gpu-b2",
              "  rank      : 2 (local_rank: 2)", "  exitcode  : -9 (pid: 4002)"]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.suspect_ranks == (2,) and diagnosis.findings[0].kind == "crashed"
    assert "SIGKILL" in diagnosis.verdict and "gpu-b2" in diagnosis.verdict


def test_the_launcher_s_first_failure_is_not_taken_for_the_culprit(tmp_path):
    job = job_logs(8, era="2.6", fault="never_arrives", culprits=(6,), layout="combined")
    evidence = read_logs([write_job_logs(job, tmp_path)])
    assert evidence.launcher_first_failure == 0
    assert diagnose_logs(evidence).suspect_ranks == (6,)


def test_a_partial_paste_names_nobody(tmp_path):
    diagnosis = diagnose_lines(tmp_path, timeout(0, 7), world_size=8)
    assert diagnosis.status == "inconclusive" and diagnosis.suspect_ranks == ()
    assert diagnosis.findings[0].kind == "missing_log" and diagnosis.findings[0].facts["partial"]


def test_heartbeat_monitor_on_some_ranks_and_on_all(tmp_path):
    beat = ("[rank{r}]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
            "collectives.")
    some = diagnose_lines(tmp_path, [beat.format(r=1), "[rank0]: loss 1", "[rank2]: loss 1"], name="some.log")
    assert some.status == "faults" and some.suspect_ranks == (1,) and some.findings[0].rule == "logs.watchdog_stuck"
    everyone = diagnose_lines(tmp_path, [beat.format(r=r) for r in range(3)], name="all.log")
    assert everyone.status == "inconclusive" and everyone.suspect_ranks == ()


def test_gloo_timeouts_leave_the_silent_rank(tmp_path):
    gloo = ("[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            "1800000ms for recv operation to complete")
    diagnosis = diagnose_lines(tmp_path, [gloo.format(r=r) for r in (0, 1, 3)] + ["[rank2]: epoch 3"])
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (2,)


def test_healthy_logs(tmp_path):
    diagnosis = diagnose_lines(tmp_path, ["[rank0]: loss 1.0", "[rank1]: loss 1.0"])
    assert diagnosis.status == "healthy" and diagnosis.findings == []


def test_ranks_still_in_an_op_their_peers_completed_are_stuck(tmp_path):
    pg = "[PG 1 Rank {local}]"
    lines = timeout(0, 1516, numel=25427968, pg=pg) + timeout(1, 1517, numel=1, pg=pg, enq=1517, done=1516)
    lines += timeout(2, 1517, numel=1, pg=pg, enq=1517, done=1516)
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (0,)
    assert diagnosis.findings[0].rule == "logs.stuck_behind_peers" and diagnosis.findings[0].kind == "stuck"


def test_a_few_that_entered_an_op_idle_peers_never_issued_went_ahead(tmp_path):
    lines = timeout(0, 9) + sum((told(r, 8) for r in (1, 2, 3)), [])
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "faults" and diagnosis.suspect_ranks == (0,)
    assert (diagnosis.findings[0].kind, diagnosis.findings[0].rule) == ("extra_op", "logs.went_ahead")


def test_an_even_split_blames_the_ranks_behind_as_for_dumps(tmp_path):
    diagnosis = diagnose_lines(tmp_path, timeout(0, 9) + told(1, 8))
    assert diagnosis.suspect_ranks == (1,) and diagnosis.findings[0].facts["tie"]


def test_silent_ranks_that_outnumber_the_waiting_ones_are_no_proof(tmp_path):
    lines = timeout(0, 9) + [f"[rank{r}]: loss 1.0" for r in (1, 2, 3)]
    diagnosis = diagnose_lines(tmp_path, lines)
    assert diagnosis.status == "inconclusive" and diagnosis.suspect_ranks == ()


def test_a_rank_behind_in_one_group_because_it_waits_in_another_is_a_consequence(tmp_path):
    tp = "[PG ID 1 PG GUID 1(tp) Rank {local}]"
    lines = timeout(2, 40, pg=tp, local=0, minute=10) + told(2, 6)  # waits in TP; behind in the default group
    lines += ["[rank3]: loss 1.0"]  # its TP peer (group rank 1) never came
    lines += timeout(0, 7) + timeout(1, 7)
    diagnosis = diagnose_lines(tmp_path, lines)
    blocked = [f for f in diagnosis.findings if f.rule == "logs.blocked_elsewhere"]
    assert blocked and blocked[0].ranks and not blocked[0].is_root
    assert 2 not in diagnosis.suspect_ranks
