"""The timeline at scale: lanes of a healthy job, the default choice of ranks and its cap,
queue time, queued ops and batches (issue 17)."""

import gzip
import json
import re

import pytest
from click.testing import CliRunner
from helpers import MS_NS, T0_NS, _timed, entry, write_job, write_synth_job
from test_timeline import check_well_formed, events, thread_names

from frtrace.cli.analyse import frtrace
from frtrace.diagnosis import diagnose
from frtrace.export.timeline import choose_ranks, write_timeline
from frtrace.match.analysis import analyze
from frtrace.testing.synth import Fault, generate

OVERFLOW = re.compile(r" \+\d+$")


def run(args):
    return CliRunner().invoke(frtrace, list(map(str, args)))


def read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    job = generate(world_size=32, tp=4, pp=2, steps=6, timing=True)
    return write_synth_job(tmp_path_factory.mktemp("healthy") / "dumps", job)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    job = generate(world_size=32, tp=4, pp=2, steps=6, timing=True, fault=Fault("hang", rank=5, group="tp", step=5))
    return write_synth_job(tmp_path_factory.mktemp("hung") / "dumps", job)


@pytest.mark.parametrize("timing", [True, False])
def test_a_healthy_job_needs_one_lane_per_rank_and_group(tmp_path, timing):
    directory = write_synth_job(tmp_path / "dumps", generate(world_size=16, tp=4, pp=2, steps=6, timing=timing))
    path = tmp_path / "all.json"
    result = run([directory, "--timeline", path, "--timeline-all"])
    assert result.exit_code == 0, result.output
    trace = read(path)
    check_well_formed(trace)
    tracks = thread_names(trace)
    assert not [name for name in tracks.values() if OVERFLOW.search(name)]
    assert len({pid for pid, _ in tracks}) == 16
    # Coalesced batches are one slice each, their ops listed; no marker is drawn alone.
    names = [e["name"] for e in events(trace, "X")]
    assert any(name.startswith("batch ") for name in names)
    assert not [name for name in names if name.startswith("coalesced")]
    batch = next(e for e in events(trace, "X") if e["name"].startswith("batch "))
    assert len(batch["args"]["ops"]) >= 1


def test_a_healthy_job_over_the_budget_is_capped_with_a_note(healthy, tmp_path):
    analysis = analyze([healthy], workers=1)
    diagnosis = diagnose(analysis)
    per_rank = max(len(d.entries) for d in analysis.load.dumps)
    path = tmp_path / "capped.json"
    selection = write_timeline(str(path), analysis, diagnosis, budget=5 * per_rank)
    assert selection.basis == "cap" and selection.ranks == frozenset(range(5))
    trace = read(path)
    check_well_formed(trace)
    assert {e["pid"] for e in events(trace, "M", name="process_name")} == {1, 2, 3, 4, 5}
    other = trace["otherData"]["selection"]
    assert other["basis"] == "cap" and other["ranks_drawn"] == 5 and other["ranks_in_job"] == 32
    assert "capped" in other["note"] and "--timeline-all" in other["note"]


def test_a_healthy_job_under_the_budget_is_drawn_whole(healthy, tmp_path):
    path = tmp_path / "whole.json"
    result = run([healthy, "--timeline", path])
    assert result.exit_code == 0
    assert "timeline: drew" not in result.output
    assert read(path)["otherData"]["selection"] == {"basis": "all", "note": None, "ranks_drawn": 32, "ranks_in_job": 32}


def test_the_default_timeline_of_a_hang_draws_the_ranks_around_the_finding(hung, tmp_path):
    path = tmp_path / "hang.json.gz"
    result = run([hung, "--timeline", path])
    assert result.exit_code == 1
    trace = read(path)
    check_well_formed(trace)
    pids = {e["pid"] for e in events(trace, "M", name="process_name")}
    # Rank 5 never issued the TP all_reduce; ranks 4, 6, 7 (its TP group) wait in it.
    assert pids == {5, 6, 7, 8}
    suspect_tracks = {name for (pid, _), name in thread_names(trace).items() if pid == 6}
    assert {"pg 0 (default_pg)"} < suspect_tracks and any("(tp)" in name for name in suspect_tracks)
    note = trace["otherData"]["selection"]["note"]
    assert trace["otherData"]["selection"]["basis"] == "findings"
    assert note.startswith("timeline: drew ranks 4-7 of 32") and "suspects 5" in note
    assert note in result.output  # on stderr (CliRunner mixes the streams)
    # The waiting ranks' unfinished op: from its discovered start to the dump time.
    waiting = [e for e in events(trace, "X", pid=5) if e["args"]["end"] == "never completed: dump time"]
    assert waiting and all(e["args"]["start"] == "discovered start" for e in waiting)


def test_a_hang_around_more_ranks_than_the_budget_keeps_the_suspect_first(hung, tmp_path):
    analysis = analyze([hung], workers=1)
    diagnosis = diagnose(analysis)
    per_rank = max(len(d.entries) for d in analysis.load.dumps)
    selection = choose_ranks(analysis, diagnosis, budget=2 * per_rank)
    assert selection.basis == "findings" and 5 in selection.ranks and len(selection.ranks) == 2
    assert "capped" in selection.note
    path = tmp_path / "capped.json"
    write_timeline(str(path), analysis, diagnosis, budget=2 * per_rank)
    assert 6 in {e["pid"] for e in events(read(path), "M", name="process_name")}


def test_timeline_all_and_selected_ranks_draw_what_they_say(hung, tmp_path):
    path = tmp_path / "all.json"
    result = run([hung, "--timeline", path, "--timeline-all"])
    assert result.exit_code == 1 and "timeline: drew" not in result.output
    assert len(events(read(path), "M", name="process_name")) == 32
    assert read(path)["otherData"]["selection"]["basis"] == "all"
    picked = tmp_path / "picked.json"
    run([hung, "--timeline", picked, "--selected-ranks", "0-1"])
    assert {e["pid"] for e in events(read(picked), "M", name="process_name")} == {1, 2}


def test_an_op_queued_behind_an_unfinished_one_is_an_instant(tmp_path):
    dumps = {}
    for rank in (0, 1):
        records = [_timed(entry(1), 10, 12), _timed(entry(2), 20, None)]
        if rank == 0:
            late = entry(3, state="scheduled", retired=False)
            late["time_created_ns"] = T0_NS + 21 * MS_NS
            records.append(late)
        for record_id, record in enumerate(records):
            record["record_id"] = record_id
        dumps[rank] = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                       "pg_status": {}, "comm_lib_version": "2.27.5", "entries": records}
    directory = write_job(tmp_path / "dumps", dumps)
    path = tmp_path / "t.json"
    run([directory, "--timeline", path])
    trace = read(path)
    check_well_formed(trace)
    (queued,) = events(trace, "i", cat="queued")
    assert queued["name"] == "queued: all_reduce #3" and queued["pid"] == 1
    assert queued["args"]["state"] == "scheduled"
    assert thread_names(trace)[(1, queued["tid"])] == "pg 0 (default_pg)"
    assert [e["name"] for e in events(trace, "X", pid=1)] == ["all_reduce #1", "all_reduce #2"]
