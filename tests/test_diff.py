"""`frtrace diff OLD NEW`: which ranks and groups made no progress between two dump sets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from helpers import assert_no_traceback, fixture_dir, job, write_job

from frtrace.cli import cli
from frtrace.cli.analyse import frtrace
from frtrace.cli.diff import frtrace_diff
from frtrace.match.analysis import analyze
from frtrace.report.progress_diff import JobMismatch, diff_progress
from frtrace.testing.synth import Fault, generate
from frtrace.testing.synth import write_job as write_synth

TP = {"0": ("default_pg", (0, 1, 2, 3)), "tp0": ("tp", (0, 1)), "tp1": ("tp", (2, 3))}


def run_diff(*args):
    result = CliRunner().invoke(frtrace_diff, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert_no_traceback(result)
    return result


def synth_pair(tmp_path, old_steps=3, new_steps=5, **kwargs):
    old, new = tmp_path / "old", tmp_path / "new"
    write_synth(generate(steps=old_steps, timing=True, **kwargs), old)
    write_synth(generate(steps=new_steps, timing=True, **kwargs), new)
    return old, new


def test_hang_dumped_twice_is_stuck(tmp_path):
    hang = Fault("hang", rank=5, group="tp", step=2)
    old, _ = synth_pair(tmp_path, fault=hang)
    new = tmp_path / "again"
    shutil.copytree(old, new)  # nothing moved: NEW equals OLD
    result = run_diff(old, new)
    assert result.exit_code == 1, result.output
    first = result.output.splitlines()[0]
    # The culprit waits in no collective while its peers wait in one: it comes first.
    assert first.startswith("STUCK: rank 5 made no progress between OLD and NEW, waiting in no collective")
    assert "ranks 2-3,6-7 stayed in recv p2p #5 of groups 5-8 (pp)" in first and len(first) < 250
    report = json.loads(run_diff(old, new, "--format", "json").output)
    assert report["status"] == "faults" and report["moved_ranks"] == []
    assert report["idle_ranks"] == [5] and 4 in report["stuck_ranks"]
    (rank4,) = [r for r in report["ranks"] if r["rank"] == 4]
    assert rank4["stuck_in"]["pg_name"] == "3" and rank4["stuck_in"]["collective_seq_id"] == 11
    assert report["no_progress_ranks"] == list(range(8))


def test_healthy_job_moving_on(tmp_path):
    old, new = synth_pair(tmp_path)
    result = run_diff(old, new)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("PROGRESSING: every rank (0-7) moved on between OLD and NEW")
    report = json.loads(run_diff(old, new, "--format", "json").output)
    assert report["status"] == "healthy" and report["moved_ranks"] == list(range(8))
    assert {g["status"] for g in report["groups"]} == {"moved"}


def test_hang_after_progress_counts_as_moved(tmp_path):
    # OLD before the hang, NEW in it: every rank did something between the two.
    old, new = tmp_path / "old", tmp_path / "new"
    write_synth(generate(steps=2, timing=True), old)
    write_synth(generate(steps=5, timing=True, fault=Fault("hang", rank=5, group="tp", step=3)), new)
    assert run_diff(old, new).exit_code == 0


def test_only_the_rank_that_stopped(tmp_path):
    # OLD at the end of step 1; rank 5 then stops before its first op of step 2, the
    # others go on into step 2: rank 5 alone made no progress.
    old, new = tmp_path / "old", tmp_path / "new"
    write_synth(generate(steps=2, timing=True), old)
    write_synth(generate(steps=4, timing=True, fault=Fault("hang", rank=5, group="tp", step=2)), new)
    result = run_diff(old, new)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("STUCK: rank 5 made no progress between OLD and NEW, waiting in no collective")
    assert "ranks 0-4,6-7 moved on" in result.output.splitlines()[0]


def two_tp_groups(tmp_path, new_steps_rank23: int):
    """Rank 0 waits in all_gather #1 of tp0, which rank 1 never issues; ranks 2-3 run
    `n` all_gathers in tp1 (1 in OLD)."""
    def steps(n):
        return {0: ["all_reduce", "all_gather@tp0"], 1: ["all_reduce"],
                2: ["all_reduce"] + ["all_gather@tp1"] * n, 3: ["all_reduce"] + ["all_gather@tp1"] * n}

    old = write_job(tmp_path / "old", job(steps(1), groups=TP))
    new = write_job(tmp_path / "new", job(steps(new_steps_rank23), groups=TP))
    return old, new


def test_one_group_moving_another_not(tmp_path):
    old, new = two_tp_groups(tmp_path, 3)
    result = run_diff(old, new)
    assert result.exit_code == 1, result.output
    first = result.output.splitlines()[0]
    # Rank 1, which rank 0 waits for, first; then where rank 0 waits; then who moved.
    assert first == ("STUCK: rank 1 made no progress between OLD and NEW, waiting in no collective (held up outside "
                     "them?); rank 0 stayed in all_gather #1 of group tp0 (tp); ranks 2-3 moved on")
    report = json.loads(run_diff(old, new, "--format", "json").output)
    assert report["stuck_ranks"] == [0] and report["moved_ranks"] == [2, 3] and report["idle_ranks"] == [1]
    groups = {g["pg_name"]: g for g in report["groups"]}
    assert groups["tp0"]["status"] == "stuck" and groups["tp1"]["status"] == "moved"
    stuck = groups["tp0"]["members"][0]
    assert stuck["progress"] == "stuck" and stuck["old"]["waiting_in"]["op"] == "all_gather"
    # The folded table has the stuck group first.
    table = result.output.splitlines()[5]
    assert table.split()[0] == "tp0" and "0 (all_gather #1)" in table


def test_library_answers_the_same(tmp_path):
    old, new = two_tp_groups(tmp_path, 2)
    diff = diff_progress(analyze([old]), analyze([new]))
    assert diff.status == "faults"
    assert diff.ranks_with("stuck") == [0] and diff.ranks_with("moved") == [2, 3]


def test_only_active_dumps(tmp_path):
    # Dumps that keep only active entries: a finished op leaves the buffer; pg_status moves.
    def active(dumps):
        for data in dumps.values():
            data["entries"] = [e for e in data["entries"] if e["state"] != "completed"]
        return dumps

    steps_old = {r: ["all_reduce", "all_reduce"] for r in range(4)}
    steps_old[3] = ["all_reduce"]  # ranks 0-2 wait in #2
    old = job(steps_old, world=4)
    new = job({r: ["all_reduce", "all_reduce", "all_reduce"] for r in range(4)}, world=4)
    for r in range(3):  # #3 is pending in NEW on ranks 0-2 only
        new[r]["entries"][-1].update(state="started", retired=False)
    new[3]["entries"] = new[3]["entries"][:2]
    for data in (old, new):
        for record in data.values():
            record["entries"][0]["record_id"] = 0
    result = run_diff(write_job(tmp_path / "old", active(old)), write_job(tmp_path / "new", active(new)))
    assert result.exit_code == 0, result.output


def test_rank_in_only_one_set_is_inconclusive(tmp_path):
    old, new = synth_pair(tmp_path)
    (new / "nccl_trace_rank_7").unlink()
    result = run_diff(old, new)
    assert result.exit_code == 3, result.output
    assert result.output.startswith("INCONCLUSIVE: rank 7 cannot be told (no dump in NEW); ranks 0-6 moved on")


@pytest.mark.parametrize("case", ["world_size", "restart", "swapped", "same_path"])
def test_mismatched_jobs_exit_2(tmp_path, case):
    old, new = synth_pair(tmp_path)
    if case == "world_size":
        new = tmp_path / "big"
        write_synth(generate(world_size=16, steps=3, timing=True), new)
    elif case == "restart":
        new = tmp_path / "restarted"
        write_synth(generate(steps=5, timing=True, seed=7, fault=Fault("straggler", rank=1, straggler_ms=3)), new)
    elif case == "swapped":
        old, new = new, old
    else:
        new = tmp_path / "old" / "."
    result = run_diff(old, new)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("Usage:", "Try "))]
    assert len(lines) == 1, result.stderr
    expected = {"world_size": "world size 8 in OLD, 16 in NEW", "restart": "dumps of different runs",
                "swapped": "swap the two", "same_path": "the same path"}[case]
    assert expected in lines[0]


def test_library_raises_on_other_job(tmp_path):
    old, _ = synth_pair(tmp_path)
    other = write_job(tmp_path / "other", job({r: ["all_reduce@x"] for r in range(8)}, groups={"x": ("", tuple(range(8)))}))
    with pytest.raises(JobMismatch, match="no process group in common"):
        diff_progress(analyze([old]), analyze([other]))


def test_json_is_deterministic_and_sorted(tmp_path):
    old, new = two_tp_groups(tmp_path, 3)
    first = run_diff(old, new, "--format", "json").output
    # Same dumps, other names and order on disk: the same bytes.
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    for path in sorted(new.iterdir(), reverse=True):
        shutil.copy(path, shuffled / path.name)
    assert run_diff(old, shuffled, "--format", "json").output == first
    report = json.loads(first)
    assert report["schema"] == "frtrace.diff/1"
    assert first == json.dumps(report, indent=2, sort_keys=True) + "\n"
    assert [r["rank"] for r in report["ranks"]] == sorted(r["rank"] for r in report["ranks"])
    assert [g["pg_name"] for g in report["groups"]] == ["0", "tp0", "tp1"]
    for key in ("moved_ranks", "stuck_ranks", "idle_ranks", "unknown_ranks", "no_progress_ranks"):
        assert report[key] == sorted(report[key])


def test_markdown(tmp_path):
    old, new = two_tp_groups(tmp_path, 3)
    result = run_diff(old, new, "--format", "markdown")
    assert result.exit_code == 1
    assert result.output.startswith("### frtrace diff: STUCK\n\n**STUCK: rank 1 made no progress")
    assert "| group" in result.output


def test_exit_zero(tmp_path):
    old, new = two_tp_groups(tmp_path, 3)
    assert run_diff(old, new, "--exit-zero").exit_code == 0


def test_missing_input_is_a_usage_error(tmp_path):
    result = run_diff(tmp_path / "nope", tmp_path)
    assert result.exit_code == 2 and "no such directory or file" in result.stderr


# --------------------------------------------------------------------------- routing


def test_routing_keeps_the_main_command(tmp_path, monkeypatch):
    old, new = two_tp_groups(tmp_path, 3)
    shutil.copytree(old, tmp_path / "diff")
    monkeypatch.chdir(tmp_path)

    def invoke(*args):
        result = CliRunner().invoke(cli, list(args))
        assert_no_traceback(result)
        return result

    assert invoke("diff", "old", "new").stdout.startswith("STUCK: rank 1")
    assert json.loads(invoke("old", "--format", "json").stdout)["schema"] == "frtrace.report/1"
    assert json.loads(invoke("-d", "diff", "--format", "json").stdout)["schema"] == "frtrace.report/1"
    assert json.loads(invoke("./diff", "--format", "json").stdout)["schema"] == "frtrace.report/1"
    header = invoke("-j", "--selected-ranks", "0", "1", "old").stdout.splitlines()[0]
    assert "rank 0" in header and "rank 1" in header and "rank 2" not in header


def test_help_mentions_diff():
    result = CliRunner().invoke(frtrace, ["--help"])
    assert result.exit_code == 0 and "frtrace diff" in result.output
    # The group's help is the analysis's, with diff listed as a command.
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and result.output.startswith("Usage: frtrace [OPTIONS] [DIR_OR_FILE_OR_URL]...")
    commands = result.output.split("Commands:")[1]
    assert commands.split()[0] == "diff"
    result = CliRunner().invoke(frtrace_diff, ["--help"])
    assert result.exit_code == 0 and "frtrace diff dumps-1200/ dumps-1210/" in result.output


def test_console_entry_point(tmp_path):
    """The real entry point: `diff` routes to the diff command; a directory named diff is
    still reachable as ./diff; errors are one line, no traceback."""
    old, new = two_tp_groups(tmp_path, 3)
    shutil.copytree(old, tmp_path / "diff")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "frtrace", *args], cwd=tmp_path, capture_output=True, text=True)

    stuck = run("diff", "old", "new")
    assert stuck.returncode == 1 and stuck.stdout.startswith("STUCK: rank 1")
    plain = run("./diff", "--format", "json")
    assert json.loads(plain.stdout)["schema"] == "frtrace.report/1"
    lonely = run("diff")
    assert lonely.returncode == 2 and "Traceback" not in lonely.stderr
    assert "frtrace ./diff" in lonely.stderr


def test_dumps_without_entries_cannot_tell(tmp_path):
    # Real gloo dumps with no entries (and no group in pg_config): exit 3, not "other job".
    old = fixture_dir("healthy_no_entries")
    new = shutil.copytree(old, tmp_path / "new")
    result = run_diff(old, new)
    assert result.exit_code == 3, result.output
    assert result.output.startswith("INCONCLUSIVE: ranks 0-1 cannot be told (no entries in either dump)")


def test_gloo_hang_dumped_twice(tmp_path):
    # Real gloo dumps: rank 3 still waits in all_reduce #4; ranks 0-1 timed out (gloo
    # retires that op too) and rank 2 never issued it: nobody moved.
    old = fixture_dir("hang_never_arrives")
    new = shutil.copytree(old, tmp_path / "new")
    result = run_diff(old, new, "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["stuck_ranks"] == [3] and report["moved_ranks"] == []


def test_archives_and_urls_are_inputs_as_for_the_main_command(tmp_path, monkeypatch):
    import tarfile

    old, new = two_tp_groups(tmp_path, 3)
    with tarfile.open(tmp_path / "old.tar.gz", "w:gz") as archive:
        archive.add(old, arcname="old")
    result = run_diff(tmp_path / "old.tar.gz", new)
    assert result.exit_code == 1 and result.stdout.startswith("STUCK: rank 1 made no progress")
    assert f"OLD {tmp_path / 'old.tar.gz'}: 4 dumps" in result.stdout
    # A URL stays a URL (a path would fold s3:// into s3:/): without fsspec, the error
    # names what reading it needs.
    monkeypatch.setitem(sys.modules, "fsspec", None)
    result = run_diff("s3://bucket/job/1200/", "s3://bucket/job/1210/")
    assert result.exit_code == 2 and result.stderr.startswith("frtrace: error: OLD: reading URLs needs fsspec")
    result = run_diff("s3://bucket/job/1200/", "s3://bucket/job/1200/")
    assert result.exit_code == 2 and "OLD and NEW are the same path" in result.stderr
