import gzip
import json
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner
from helpers import gloo_hang_dumps, nccl_hang_dumps, write_job, write_json

from frtrace.cli.analyse import frtrace
from frtrace.diagnosis import diagnose
from frtrace.export.timeline import write_timeline
from frtrace.match.analysis import analyze

ENTRIES = 19  # in nccl_hang_dumps(): 6 + 6 + 4 + 3


def run(args):
    result = CliRunner().invoke(frtrace, list(map(str, args)))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def timeline(directory, tmp_path, *options, name="trace.json"):
    path = tmp_path / name
    result = run([directory, "--timeline", path, *options])
    assert result.exit_code == 1, result.output
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture
def job(tmp_path):
    """4 ranks; rank 3 never issues all_reduce #4 of group 0; rank 2's clock is 5 ms ahead."""
    return write_job(tmp_path / "dumps", nccl_hang_dumps(skew_ns={2: 5_000_000}))


@pytest.fixture
def trace(job, tmp_path):
    return timeline(job, tmp_path)


def events(trace, ph, **fields):
    return [e for e in trace["traceEvents"] if e["ph"] == ph and all(e.get(k) == v for k, v in fields.items())]


def ns(us):
    """What Perfetto makes of a microsecond value: it truncates `us * 1000`."""
    return int(us * 1000)


def process_names(trace):
    return {e["pid"]: e["args"]["name"] for e in events(trace, "M", name="process_name")}


def thread_names(trace):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events(trace, "M", name="thread_name")}


def slice_named(trace, rank, name):
    (found,) = [e for e in events(trace, "X", pid=rank + 1) if e["name"] == name]
    return found


def check_well_formed(trace):
    """The invariants Perfetto and chrome://tracing rely on."""
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert {"ph", "pid", "name"} <= set(event), event
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0, event
    named_tracks = thread_names(trace)
    by_track = defaultdict(list)
    for event in events(trace, "X"):
        assert event["dur"] >= 0
        assert (event["pid"], event["tid"]) in named_tracks
        start = ns(event["ts"])
        by_track[(event["pid"], event["tid"])].append((start, start + ns(event["dur"])))
    # Complete events on one track must not overlap, or Perfetto drops them.
    for spans in by_track.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start
    flows = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] in "sf":
            flows[event["id"]].append(event)
    for flow_id, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], flow_id
        assert len({(e["name"], e["cat"]) for e in pair}) == 1
        for point in pair:
            assert point["bp"] == "e"
            # Bound to the enclosing slice: it must lie strictly inside one on its track.
            at = ns(point["ts"])
            assert any(s <= at < e for s, e in by_track[(point["pid"], point["tid"])]), point
    for event in events(trace, "i", s="t"):
        assert (event["pid"], event["tid"]) in named_tracks
    return flows


def test_trace_is_well_formed(trace):
    flows = check_well_formed(trace)
    # Chains of n-1 arrows per collective (4+4+4+3 ranks, 2 for the tp all_gather) and one send->recv.
    assert len(flows) == 3 + 3 + 3 + 2 + 1 + 1


def test_one_process_per_rank_and_one_slice_per_entry(trace):
    assert process_names(trace) == {1: "rank 0", 2: "rank 1", 3: "rank 2", 4: "rank 3"}
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in events(trace, "M", name="process_sort_index")}
    assert sort_index == {1: 0, 2: 1, 3: 2, 4: 3}
    assert len(events(trace, "X")) == ENTRIES
    assert Counter(e["pid"] for e in events(trace, "X")) == {1: 6, 2: 6, 3: 4, 4: 3}
    send = slice_named(trace, 0, "send 0->1 p2p#1")
    assert send["cat"] == "p2p"
    args = slice_named(trace, 0, "all_reduce #4")["args"]
    assert args["state"] == "started" and args["collective_seq_id"] == 4
    assert args["input_sizes"] == "[[16]]" and args["input_dtypes"] == ["Float"]
    assert args["profiling_name"] == "nccl:all_reduce" and args["end"].startswith("never completed")
    assert args["call_site"] == "/workspace/job/train.py:42 in train_step"


def test_tracks_are_named_after_groups_and_ops_of_a_group_share_one(trace):
    tracks = thread_names(trace)
    assert len(set(tracks)) == len(tracks) and len({tid for _, tid in tracks}) == len(tracks)
    second = slice_named(trace, 0, "all_reduce #2")
    third = slice_named(trace, 0, "all_reduce #3")  # discovered started before #2's discovered completion
    assert tracks[(1, second["tid"])] == "pg 0 (default_pg)"
    assert third["tid"] == second["tid"]
    # #2 is drawn to #3's start (they ran in turn); its discovered completion stays in args.
    assert ns(second["ts"]) + ns(second["dur"]) == ns(third["ts"])
    assert second["args"]["end"] == "next op's discovered start" and second["args"]["time_completed_ns"]
    assert tracks[(1, slice_named(trace, 0, "all_gather #1")["tid"])] == "pg 1 (tp)"
    assert slice_named(trace, 0, "all_reduce #4")["tid"] == second["tid"]
    assert not [name for name in tracks.values() if "+" in name]


def test_not_issued_marker_on_rank_3(trace):
    (marker,) = events(trace, "i", s="t")
    assert marker["pid"] == 4 and marker["name"] == "NOT ISSUED all_reduce #4"
    assert marker["args"]["issued_by_ranks"] == [0, 1, 2]
    assert thread_names(trace)[(4, marker["tid"])] == "pg 0 (default_pg): not issued"
    last = max(ns(e["ts"]) + ns(e["dur"]) for e in events(trace, "X", pid=4))
    assert ns(marker["ts"]) == last  # rank 3's newest timestamp: when it completed #3


def test_findings_are_global_instants_at_the_divergence(trace):
    (finding,) = [e for e in events(trace, "i", s="g") if e["args"]["severity"] == "error"]
    assert finding["cat"] == "finding" and finding["args"]["kind"] == "not_issued"
    assert finding["args"]["suspect_ranks"] == [3]
    first_in = min(e["args"]["time_created_ns"] for e in events(trace, "X") if e["name"] == "all_reduce #4")
    assert ns(finding["ts"]) == first_in - trace["otherData"]["time_origin_ns"]


def test_slices_run_from_discovered_start_to_completion_on_raw_clocks(trace):
    other = trace["otherData"]
    assert other["clocks"]["aligned"] is False and "not aligned" in other["clocks"]["note"]
    assert other["frtrace_version"] and other["time_origin_ns"] > 0
    assert set(other["legend"]) >= {"discovered start", "discovered completion", "queued_ms"}
    first = slice_named(trace, 0, "all_reduce #1")
    # Created at 0, discovered started 50 us later, completed at 2 ms: queue time is an argument.
    assert first["ts"] == pytest.approx(50, abs=0.001) and ns(first["dur"]) == 2_000_000 - 50_000
    assert first["args"]["queued_ms"] == 0.05
    assert first["args"]["start"] == "discovered start" and first["args"]["end"] == "discovered completion"
    # Rank 2's host clock runs 5 ms ahead: drawn as dumped, not shifted.
    assert slice_named(trace, 2, "all_reduce #1")["ts"] == pytest.approx(5000 + 200 + 50, abs=1)


def test_gloo_uses_the_next_entry_as_a_stand_in_end(tmp_path):
    trace = timeline(write_job(tmp_path / "gloo", gloo_hang_dumps()), tmp_path)
    check_well_formed(trace)
    assert trace["otherData"]["clocks"]["aligned"] is False
    first, second = slice_named(trace, 0, "all_reduce #1"), slice_named(trace, 0, "all_reduce #2")
    assert "stand-in" in first["args"]["end"] and "next entry" in first["args"]["end"]
    assert ns(first["ts"]) + ns(first["dur"]) == ns(second["ts"])
    assert slice_named(trace, 0, "all_reduce #4")["args"]["end"].startswith("never completed")
    assert [e["pid"] for e in events(trace, "i", s="t")] == [4]


def test_gzip_variant_loads_and_matches(job, tmp_path):
    plain = timeline(job, tmp_path, name="trace.json")
    packed = timeline(job, tmp_path, name="trace.json.gz")
    assert packed == plain
    again = tmp_path / "again.json.gz"
    run([job, "--timeline", again])
    assert again.read_bytes() == (tmp_path / "trace.json.gz").read_bytes()


def test_selected_ranks_narrow_the_processes(job, tmp_path):
    trace = timeline(job, tmp_path, "--selected-ranks=0,1")
    check_well_formed(trace)
    assert process_names(trace) == {1: "rank 0", 2: "rank 1"}
    assert len(events(trace, "X")) == 12
    assert events(trace, "i", s="t") == []  # rank 3's marker is not drawn


def test_pg_filters_narrow_the_groups(job, tmp_path):
    trace = timeline(job, tmp_path, "--pg-filters=tp")
    check_well_formed(trace)
    assert {e["name"] for e in events(trace, "X")} == {"all_gather #1"}
    assert set(thread_names(trace).values()) == {"pg 1 (tp)"}
    assert events(trace, "i", s="g") == []  # the finding is about group 0


def test_library_call_with_filters(job, tmp_path):
    analysis = analyze([job])
    path = tmp_path / "lib.json"
    write_timeline(str(path), analysis, diagnose(analysis), ranks=[3], pg_filters=("default_pg",))
    trace = json.loads(path.read_text())
    check_well_formed(trace)
    assert process_names(trace) == {4: "rank 3"}
    assert len(events(trace, "X")) == 3 and len(events(trace, "i", s="t")) == 1


def test_missing_dump_rank_gets_an_empty_process(job, tmp_path):
    (job / "rank_3").unlink()
    trace = timeline(job, tmp_path)
    check_well_formed(trace)
    assert process_names(trace)[4] == "rank 3 (no dump)"
    assert [e["name"] for e in events(trace, "i", pid=4)] == ["NO DUMP"]


def test_timeline_suffix_and_overwrite_rules(job, tmp_path):
    result = run([job, "--timeline", tmp_path / "trace.txt"])
    assert result.exit_code == 2 and ".json.gz" in result.output
    path = tmp_path / "trace.json"
    path.write_text("keep me")
    result = run([job, "--timeline", path])
    assert result.exit_code == 2 and "already exists" in result.output and path.read_text() == "keep me"
    assert run([job, "--timeline", path, "--force"]).exit_code == 1
    assert json.loads(path.read_text())["traceEvents"]


def test_never_overwrites_a_json_dump(tmp_path):
    directory = tmp_path / "dumps"
    directory.mkdir()
    for rank, data in nccl_hang_dumps().items():
        write_json(directory / f"rank_{rank}.json", data)
    before = (directory / "rank_1.json").read_text()
    result = run([directory, "--timeline", directory / "rank_1.json", "--force"])
    assert result.exit_code == 2 and "refusing to overwrite an input dump file" in result.output
    assert (directory / "rank_1.json").read_text() == before


def test_perfetto_trace_processor_loads_it(trace, tmp_path):
    tp_module = pytest.importorskip("perfetto.trace_processor")
    path = tmp_path / "trace.json"
    try:
        processor = tp_module.TraceProcessor(trace=str(path))
    except Exception as exc:  # the package fetches its binary on first use; offline, skip
        pytest.skip(f"trace processor unavailable: {exc}")
    try:
        count = next(iter(processor.query("select count(*) as n from slice where dur > 0 and category != 'finding'"))).n
        assert count == ENTRIES
        flows = next(iter(processor.query("select count(*) as n from flow"))).n
        assert flows == 13
    finally:
        processor.close()


def test_a_rank_whose_dump_holds_no_entry_gets_an_empty_process(tmp_path):
    # A dump without collectives (includeCollectives=False), or one of only active
    # entries whose every op finished, holds no entry: the trace's clock used to ask its
    # newest time of nothing and stop the run.
    dumps = nccl_hang_dumps()
    dumps[1] = dict(dumps[1], entries=[])
    trace = timeline(write_job(tmp_path / "dumps", dumps), tmp_path)
    check_well_formed(trace)
    assert process_names(trace)[2].startswith("rank 1")
    assert events(trace, "X", pid=2) == []
    assert len(events(trace, "X", pid=1)) > 0
