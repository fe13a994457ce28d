"""Dumps written by PyTorch's CUPTI comms monitor (torch.profiler._cupti.comms.FlightRecorderPlugin):
read, judged, and never compared across ranks by a clock they do not share.

The jobs are frtrace.testing.synth jobs rewritten the way the monitor writes them
(`cupti_monitor_job`): NCCL's per-function sequence numbers from 0, `process_group` a list,
`process_group_ranks`, `pg_status` with group "0" only, scheduled ops without times, sends and
receives without a peer, times on CUPTI's native clock (one origin per host) unless converted."""

import json
import pickle

import pytest
from click.testing import CliRunner
from helpers import run_cli

from frtrace.cli.diff import frtrace_diff
from frtrace.load.loader import load_one
from frtrace.table.standing import keeps_only_active
from frtrace.testing.synth import Fault, SynthJob, cupti_monitor_job, generate, write_cupti_job

EXIT = {"healthy": 0, "faults": 1, "inconclusive": 3}
FAULTS = {
    "healthy": None,
    "hang_tp": Fault("hang", rank=5, group="tp", step=2),
    "hang_dp": Fault("hang", rank=2, group="dp", step=2),
    "size_mismatch": Fault("size_mismatch", rank=6, group="dp", step=1),
    "missing_dump_hang": Fault("missing_dump_hang", rank=3, group="tp", step=1),
    "skip_op": Fault("skip_op", rank=3, group="tp", step=2),
}


def monitor_job(fault=None, clock="native", max_entries=2000, world=16, steps=4, straggler=False):
    job = generate(world, tp=2, pp=2, steps=steps, fault=fault, timing=True, buffer_size=100_000, seed=2)
    return cupti_monitor_job(job, clock=clock, max_entries=max_entries)


def report(tmp_path, job, fmt="pickle"):
    write_cupti_job(job, tmp_path / "job", fmt=fmt)
    result = run_cli([tmp_path / "job", "--format", "json", "--workers", "1"])
    parsed = json.loads(result.stdout)
    assert result.exit_code == EXIT[parsed["status"]], result.stderr
    return parsed


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("clock", ["native", "unix"])
@pytest.mark.parametrize("name", sorted(FAULTS))
def test_monitor_dumps_are_judged_as_the_truth_says(tmp_path, name, clock, fmt):
    job = monitor_job(FAULTS[name], clock)
    got = report(tmp_path, job, fmt)
    assert (got["status"], got["suspect_ranks"]) == (job.truth["status"], job.truth["suspect_ranks"])
    assert got["inputs"]["writers"] == ["cupti_monitor"]
    assert got["inputs"]["clock"] == ("cupti" if clock == "native" else "wall")


@pytest.mark.parametrize("max_entries", [40, 90])
@pytest.mark.parametrize("name", ["healthy", "hang_tp"])
def test_rings_cut_at_different_points_line_up_per_op_type(tmp_path, name, max_entries):
    # Each stage keeps a different stretch of its history; NCCL numbers all_reduce, all_gather,
    # reduce_scatter of one group apart, so only (group, op type, number) lines ranks up.
    job = monitor_job(FAULTS[name], max_entries=max_entries, steps=5)
    got = report(tmp_path, job)
    assert (got["status"], got["suspect_ranks"]) == (job.truth["status"], job.truth["suspect_ranks"])


def test_the_loader_reads_what_the_monitor_writes(tmp_path):
    job = monitor_job(FAULTS["hang_tp"])
    raw = job.dumps[4]
    assert raw["entries"][0]["record_id"] > 1000 and set(raw["pg_status"]) == {"0"}
    path = write_cupti_job(job, tmp_path)[4]
    assert pickle.loads(path.read_bytes()) == raw and path.read_bytes()[1] > 2  # Python's default protocol
    dump = load_one(4, path)
    assert (dump.writer, dump.clock, dump.pg_status) == ("cupti_monitor", "cupti", {})
    entries = list(dump.entries)
    assert [e.record_id for e in entries] == [e["record_id"] for e in raw["entries"]]  # kept: they rise
    assert not keeps_only_active(dump) and not dump.wrapped  # their gaps mean nothing; every stream starts at 0
    assert {e.pg_name for e in entries if not e.is_p2p} >= {"3/all_reduce", "3/all_gather", "0/all_reduce"}
    assert {c.name: c.ranks for c in dump.pg_config}["3/all_reduce"] == (4, 5)
    assert all(e.timeout_ms is None for e in entries)


def test_entries_of_cuda_graph_collectives_keep_their_order_and_a_cut_window_is_clipped(tmp_path):
    # A collective captured in a CUDA graph carries its kernel's graph node id as record_id,
    # in no order: the entries are then numbered in the file's order. A window whose op
    # types do not all start at the first number lost its oldest ops.
    job = monitor_job(FAULTS["healthy"], max_entries=40, steps=5)
    raw = job.dumps[4]
    for entry, node_id in zip(raw["entries"], [9_000_000 - 7 * i for i in range(len(raw["entries"]))]):
        entry["record_id"] = node_id
    dump = load_one(4, write_cupti_job(job, tmp_path)[4])
    assert [e.record_id for e in dump.entries] == list(range(len(raw["entries"])))
    assert [e.op for e in dump.entries] == [e["profiling_name"][5:] for e in raw["entries"]]
    assert dump.wrapped


def test_diff_follows_a_rank_from_one_monitor_dump_to_the_next(tmp_path):
    # Between two dumps the ops in flight finished: their record ids stay, and they gained a
    # time (the kernel's start) they did not have. That is progress, not another run.
    new = monitor_job(FAULTS["hang_tp"], world=8, steps=3)
    old = {}
    for rank, dump in new.dumps.items():
        earlier = json.loads(json.dumps(dump))
        earlier["entries"] = earlier["entries"][:-4]
        for entry in earlier["entries"][-2:]:
            entry.update(state="scheduled", retired=False, time_created_ns=0, time_discovered_started_ns=None,
                         time_discovered_completed_ns=None, duration_ms=None)
        old[rank] = earlier
    write_cupti_job(SynthJob(old, new.truth), tmp_path / "old")
    write_cupti_job(new, tmp_path / "new")
    result = CliRunner().invoke(frtrace_diff, [str(tmp_path / "old"), str(tmp_path / "new"), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["moved_ranks"] == list(range(8))


def test_a_native_clock_turns_off_what_compares_times_across_ranks(tmp_path):
    # The same straggler job: on converted (Unix) times the late rank is a warning; on CUPTI's
    # native clock, whose origin differs per host, nothing is compared, and the report says so.
    straggler = Fault("straggler", rank=2, straggler_ms=80)
    unix = report(tmp_path / "unix", monitor_job(straggler, "unix"))
    assert [f["suspect_ranks"] for f in unix["findings"] if f["kind"] == "straggler"] == [[2]]
    native = report(tmp_path / "native", monitor_job(straggler, "native"))
    assert native["status"] == "healthy" and not [f for f in native["findings"] if f["kind"] == "straggler"]
    hang = report(tmp_path / "hang", monitor_job(FAULTS["hang_tp"], "native"))
    assert all(row["since_ms"] is None for row in hang["ranks"])
    text = run_cli([tmp_path / "hang" / "job", "--workers", "1"]).stdout
    assert "Times are on CUPTI's own clock" in text and "Written by PyTorch's CUPTI comms monitor" in text


def test_the_timeline_says_its_ranks_do_not_line_up(tmp_path):
    write_cupti_job(monitor_job(FAULTS["hang_tp"]), tmp_path / "job")
    run_cli([tmp_path / "job", "--workers", "1", "--timeline", tmp_path / "t.json"])
    trace = json.loads((tmp_path / "t.json").read_text())
    assert "CUPTI's own clock" in trace["otherData"]["clocks"]["note"] and trace["otherData"]["time_origin_ns"] > 0


def test_ranks_blocked_in_sends_and_receives_without_a_peer_are_victims_not_culprits(tmp_path):
    # Pipeline neighbours of the hung rank wait in a recv the monitor records without its peer:
    # they are absent from later collectives because they wait, so only the culprit is blamed.
    got = report(tmp_path, monitor_job(FAULTS["hang_tp"]))
    assert got["suspect_ranks"] == [5]
    peerless = [f for f in got["findings"] if f["rule"] == "peerless_p2p.blocked_in_peerless_p2p"]
    assert peerless and all(f["severity"] == "warning" and not f["suspect_ranks"] for f in peerless)


def test_c10d_dumps_are_on_the_wall_clock(tmp_path):
    from frtrace.testing.synth import write_job
    write_job(generate(4, tp=2, pp=1, steps=1), tmp_path / "job")
    result = run_cli([tmp_path / "job", "--format", "json", "--workers", "1"])
    inputs = json.loads(result.stdout)["inputs"]
    assert (inputs["writers"], inputs["clock"]) == (["c10d"], "wall")
