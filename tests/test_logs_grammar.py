"""The line grammar: every wording torch wrote (docs/logs.md), as these tests write it
from the format strings, read to the same events."""

import pytest

from frtrace.logs import grammar as g
from frtrace.testing.joblogs import ERAS, _Writer

WORK_NUMEL = "WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000)"


def only(events, kind):
    found = [e for e in events if isinstance(e, kind)]
    assert len(found) == 1, events
    return found[0]


@pytest.mark.parametrize("era", ERAS)
def test_every_era_s_timeout_and_status_lines_read_to_the_same_position(era):
    writer = _Writer(era, 3, 8)
    lines = writer.timeout(1580, "ALLREDUCE", (466119168, 466119168), 1.0, 1582, 1579)
    timeout = only(g.events(lines[0]), g.Timeout)
    assert timeout.op == "ALLREDUCE" and timeout.timeout_ms == 600000 and timeout.ran_for_ms == 600060
    assert timeout.seq == (None if era == "1.9" else 1580)
    assert timeout.numel_in == (466119168 if era not in ("1.9", "2.0") else None)
    assert g.group_of(lines[0]) == (None, 3)
    statuses = [e for line in lines for e in g.events(line) if isinstance(e, g.Status)]
    if era in ("1.9", "2.0", "2.1"):
        assert statuses == []
        return
    (status,) = statuses
    assert (status.at_seq, status.last_enqueued, status.last_completed) == (1580, 1582, 1579)
    assert status.last_started == (1580 if era == "2.13" else None)
    assert status.last_started_op == ("ALLREDUCE" if era == "2.13" else "")


@pytest.mark.parametrize("era, pg", [
    ("2.2", (None, 3)),
    ("2.3", (g.PgRef("0", "", None), 3)),
    ("2.4", (g.PgRef("0", "default_pg", None), 3)),
    ("2.5", (g.PgRef("0", "default_pg", 0), 3)),
    ("2.6", (g.PgRef("0", "default_pg", 0), 3)),
])
def test_the_group_prefix_of_each_era(era, pg):
    writer = _Writer(era, 3, 8)
    status_line = writer.timeout(1580, "ALLREDUCE", (1, 1), 1.0, 1580, 1579)[1]
    assert g.group_of(status_line) == pg
    assert g.is_default_group(pg[0]) == (pg[0] is not None)


def test_group_prefixes_without_a_description_and_of_other_groups():
    assert g.group_of("[PG ID 1 PG GUID 1 Rank 1]  failure detected") == (g.PgRef("1", "", 1), 1)
    assert g.group_of("[PG ID 2 PG GUID 3(tp) Rank 0] x") == (g.PgRef("3", "tp", 2), 0)
    assert g.group_of("[PG 1 Rank 0] Exception") == (g.PgRef("1", "", None), 0)
    assert not g.is_default_group(g.PgRef("1", "", 1))


@pytest.mark.parametrize("era", ["2.4", "2.5", "2.6", "2.13"])
def test_told_to_dump_lines_say_who_signalled_and_where_the_rank_stood(era):
    lines = _Writer(era, 3, 8).told(0, 1.3, 1579, 1579)
    (signal,) = [e for line in lines for e in g.events(line) if isinstance(e, g.Signal) and e.last_enqueued is not None]
    assert (signal.last_enqueued, signal.last_completed, signal.by_itself) == (1579, 1579, False)
    assert signal.from_rank == (0 if era != "2.4" else None)


def test_told_to_dump_variants():
    from_itself = only(g.events("[PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout "
                                "from this local rank and we will try our best to dump the debug info. Last enqueued NCCL "
                                "work: 20589, last completed NCCL work: 20584.This is most likely"), g.Signal)
    assert from_itself.by_itself and from_itself.last_enqueued == 20589
    older = only(g.events("[PG 0 Rank 1] Received a global timeout from another rank and will start to dump the debug "
                          "info."), g.Signal)
    assert older.from_rank is None and older.last_enqueued is None
    observed = only(g.events("[PG ID 0 PG GUID 0(default_pg) Rank 3] Observed flight recorder dump signal from another "
                             "rank via TCPStore."), g.Signal)
    assert not observed.by_itself


def test_vendor_forks_and_the_other_status_wordings():
    hccl = only(g.events("[PG 0 Rank 2] Received a dump signal from this local rank and will start to dump the debug info. "
                         "Last enqueued HCCL work: 7, last completed HCCL work: 6."), g.Signal)
    assert (hccl.last_enqueued, hccl.last_completed, hccl.by_itself) == (7, 6, True)
    error = only(g.events("[PG ID 0 PG GUID 0 Rank 1] NCCL error is detected by watchdog at work: 12, last enqueued NCCL "
                          "work: 13, last completed NCCL work: 11."), g.Status)
    assert (error.at_seq, error.failure) == (12, "error")
    timeout = only(g.events("[PG 0 Rank 1] Work timeout is detected by watchdog at work: 12, last enqueued NCCL work: 12, "
                            "last completed NCCL work: 11."), g.Status)
    assert timeout.failure == "timeout"


def test_the_work_of_torch_1_x():
    old = only(g.events("[E ProcessGroupNCCL.cpp:566] [Rank 1] Watchdog caught collective operation timeout: "
                        "WorkNCCL(OpType=BROADCAST, TensorShape=[1, 512], Timeout(ms)=1800000) ran for 1800494 "
                        "milliseconds before timing out."), g.Timeout)
    assert (old.seq, old.op, old.tensor_shape, old.ran_for_ms) == (None, "BROADCAST", "[1, 512]", 1800494)
    shape = only(g.events("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=26, OpType=BROADCAST, "
                          "TensorShape=[1, 512], Timeout(ms)=1800000) ran for 1800433 milliseconds before timing out."),
                 g.Timeout)
    assert (shape.seq, shape.numel_in) == (26, None)


def test_a_timeout_split_over_two_lines_still_names_its_work():
    timeout = only(g.events(f"what():  [PG 0 Rank 2] Process group watchdog thread terminated with exception: [Rank 2] "
                            f"Watchdog caught collective operation timeout: {WORK_NUMEL} ran f"), g.Timeout)
    assert timeout.seq == 1580 and timeout.ran_for_ms is None


@pytest.mark.parametrize("line, expected", [
    ("[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x", ("E", True, 2 * 3600 + 7 * 60 + 8.408271257)),
    ("[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] x", ("E", True, 20 * 3600 + 27 * 60 + 21.42641554)),
    ("[E ProcessGroupNCCL.cpp:828] x", ("E", False, None)),
    ("E0321 02:07:08.408271 12345 ProcessGroupNCCL.cpp:607] x", ("E", True, 2 * 3600 + 7 * 60 + 8.408271)),
])
def test_c10_glog_and_untimed_headers(line, expected):
    head = g.header(line)
    level, timed, seconds_of_day = expected
    assert head.level == level and head.has_c10_time == timed and head.source_file == line.split(":")[-2].split()[-1]
    if seconds_of_day is None:
        assert head.at is None
    else:
        assert head.at % 86400 == pytest.approx(seconds_of_day)


def test_prefixes_torchrun_slurm_ray_and_several_ranks_on_one_line():
    ((prefix, text),) = g.segments("  3: [rank11]:[E ProcessGroupNCCL.cpp:1] hi")
    assert prefix.task == 3 and (prefix.label, prefix.label_rank) == ("rank", 11) and text.startswith("[E ")
    ((prefix, _),) = g.segments("[default5]:[E ProcessGroupNCCL.cpp:1] hi")
    assert (prefix.label, prefix.label_rank) == ("local", 5)
    ((prefix, _),) = g.segments("(WorkerDict pid=3490362, ip=10.1.2.3) [rank1]:[E ProcessGroupNCCL.cpp:1] x")
    assert (prefix.ray_pid, prefix.ray_ip, prefix.label_rank) == (3490362, "10.1.2.3", 1)
    pieces = g.segments("Epoch 10/10: 240it [05:55][rank0]:[E x.cpp:1] a[rank1]:[E x.cpp:1] b")
    assert [(p.label_rank, t) for p, t in pieces] == [(0, "[E x.cpp:1] a"), (1, "[E x.cpp:1] b")]
    assert g.segments("[0]:") == [(g.Prefix(), "[0]:")]  # a failure summary's index, not a rank
    ((prefix, text),) = g.segments("worker-3: [rank9]:[E x.cpp:1] x")
    assert (prefix.host, prefix.label_rank, text) == ("worker-3", 9, "[E x.cpp:1] x")
    ((prefix, _),) = g.segments("RuntimeError: [Rank 1] x")
    assert prefix.host is None


def test_nccl_lines_give_host_pid_and_the_communicator_rank():
    nccl = only(g.events("node01:1234:1300 [3] NCCL INFO comm 0x55d2c rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 41000 "
                         "commId 0x7a1f - Init COMPLETE"), g.Nccl)
    assert (nccl.host, nccl.pid, nccl.level, nccl.comm_rank, nccl.nranks) == ("node01", 1234, "INFO", 3, 16)
    warn = only(g.events("x3203c0s25b1n0.hsn.cm:322638:323016 [0] NCCL WARN NET/IB : Got completion with error 12"), g.Nccl)
    assert warn.host == "x3203c0s25b1n0.hsn.cm" and warn.level == "WARN"
    assert only(g.events("gpu-a:1:2 [0] NCCL INFO NCCL version 2.19.3+cuda12.3"), g.Nccl).starts_run


def test_exceptions_and_what_they_say_about_blame():
    oom = g.exception_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert oom is not None and not g.is_collateral(oom.type, oom.message)
    aborted = g.exception_line("torch.distributed.DistBackendError: [Rank 1] NCCL communicator was aborted on rank 1.")
    assert aborted is not None and g.is_collateral(aborted.type, aborted.message)
    assert g.is_collateral("KeyboardInterrupt", "")
    assert not g.is_collateral("torch.distributed.DistBackendError", "NCCL error: unhandled cuda error, NCCL version 2.19")
    assert g.exception_line("  File \"train.py\", line 3, in <module>") is None
    assert g.exception_line("During handling of the above exception, another exception occurred:") is None
    assert g.exit_text(-9) == "signal 9 (SIGKILL)" and not g.exit_is_collateral(-9) and g.exit_is_collateral(-6)


def test_launcher_summary_gloo_and_heartbeat_lines():
    assert only(g.events("  host      : node07"), g.SummaryField) == g.SummaryField("host", "node07")
    assert only(g.events("  rank      : 13 (local_rank: 5)"), g.SummaryField).value == "13 (local_rank: 5)"
    assert only(g.events("Root Cause (first observed failure):"), g.SummaryStart).root_cause
    assert only(g.events("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                         "1800000ms for recv operation to complete"), g.GlooTimeout).timeout_ms == 1800000
    beat = only(g.events("[PG ID 0 PG GUID 0(default_pg) Rank 6] ProcessGroupNCCL's watchdog got stuck for 480 seconds "
                         "without making progress in monitoring enqueued collectives."), g.Heartbeat)
    assert beat.stuck_s == 480
    init = only(g.events("[PG ID 1 PG GUID 1 Rank 0] ProcessGroupNCCL initialization options: size: 4, global rank: 4, "
                         "TIMEOUT(ms): 600000"), g.GroupInit)
    assert (init.size, init.global_rank) == (4, 4)


def test_torch_versions_from_the_wordings_seen():
    assert g.torch_versions(["work_numel", "exception_at", "prefix_pg_guid", "header_timed"]) == "2.5"
    assert g.torch_versions(["work_numel", "failure_at"]) == "2.6+"
    assert g.torch_versions(["work_shape", "failure_at"]) == ""  # no torch wrote both
    assert g.torch_versions([]) == ""
