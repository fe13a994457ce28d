"""The CLI's habits around the analysis: outputs checked before any dump is read,
options never dropped silently, signals, pipes and full disks, and output safety."""

import gzip
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import FIXTURES, dump, entry, write_job, write_json

from frtrace.cli import analyse as cli
from frtrace.cli import output
from frtrace.cli.analyse import frtrace
from frtrace.export import outputs
from frtrace.export.paths import OutputError, plan_output, write_atomically

NO_FRAMES = FIXTURES / "hang_no_frames"


def run(args, **kwargs):
    result = CliRunner().invoke(frtrace, list(map(str, args)), **kwargs)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def healthy_job(directory: Path, world: int = 2) -> Path:
    return write_job(directory, {r: dump([entry(s) for s in (1, 2)], ranks=range(world)) for r in range(world)})


@pytest.fixture
def job(tmp_path):
    return healthy_job(tmp_path / "dumps")


@pytest.fixture
def no_analysis(monkeypatch):
    """Fails the test if the dumps are read at all."""
    def refuse(*args, **kwargs):
        raise AssertionError("the dumps were read before the outputs were checked")
    monkeypatch.setattr(cli, "analyze", refuse)


# --------------------------------------------------------------------------- A: outputs first


@pytest.mark.parametrize("name, problem", [
    ("o1", "unsupported database file type"),
    ("missing_dir/db.pkl", "does not exist"),
    ("exists.pkl", "already exists (add --force"),
    ("dangling.pkl", "is a symlink (add --force"),
])
def test_a_bad_output_fails_in_one_line_before_any_dump_is_read(job, tmp_path, no_analysis, name, problem):
    (tmp_path / "exists.pkl").write_bytes(b"old")
    (tmp_path / "dangling.pkl").symlink_to(tmp_path / "nowhere")
    result = run([job, "-o", tmp_path / name])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and problem in result.output
    assert (tmp_path / "exists.pkl").read_bytes() == b"old" and os.path.islink(tmp_path / "dangling.pkl")


def test_a_dangling_symlink_is_replaced_with_force(job, tmp_path):
    (tmp_path / "dangling.pkl").symlink_to(tmp_path / "nowhere")
    result = run([job, "-o", tmp_path / "dangling.pkl", "--force"])
    assert result.exit_code == 0
    assert not os.path.islink(tmp_path / "dangling.pkl") and not (tmp_path / "nowhere").exists()


def test_an_output_failing_after_the_analysis_still_prints_the_report_and_exits_2(job, tmp_path, monkeypatch):
    def disk_full(tmp, analysis, diagnosis):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(outputs, "write_sqlite", disk_full)
    result = run([job, "-o", tmp_path / "db.sqlite", "--timeline", tmp_path / "t.json"], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stdout.startswith("HEALTHY")
    assert f"frtrace: error: no space left on device writing {tmp_path / 'db.sqlite'}" in result.stderr
    assert "internal error" not in result.stderr and (tmp_path / "t.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dumps", "t.json"]


def test_enospc_while_writing_a_pickle_says_no_space_left(job, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs.pickle, "dump", full)
    result = run([job, "-o", tmp_path / "db.pkl"])
    assert result.exit_code == 2 and f"no space left on device writing {tmp_path / 'db.pkl'}" in result.stderr


def test_an_sqlite_output_says_which_format_it_wrote(job, tmp_path):
    result = run([job, "-o", tmp_path / "x.db"])
    assert result.exit_code == 0
    assert f"frtrace: wrote {tmp_path / 'x.db'} (SQLite database" in result.stderr
    assert (tmp_path / "x.db").read_bytes().startswith(b"SQLite format 3\x00")


def test_o_and_timeline_may_not_name_the_same_file(job, tmp_path, no_analysis):
    result = run([job, "-o", tmp_path / "x.json", "--timeline", tmp_path / "x.json"])
    assert result.exit_code == 2


# --------------------------------------------------------------------------- B: no option dropped


@pytest.mark.parametrize("extra", [["-o", "db.pkl"], ["--timeline", "t.json"], ["--format", "json"]])
def test_j_with_an_output_or_format_is_a_usage_error(job, tmp_path, no_analysis, extra, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(["-j", job, *extra])
    assert result.exit_code == 2 and "-j prints the raw entries only" in result.stderr
    assert not (tmp_path / extra[1]).exists()


def test_j_with_a_scheduler_says_it_reads_here(job):
    plain = run(["-j", job])
    result = run(["-j", job, "--scheduler", "tcp://192.0.2.1:8786"])  # never contacted
    assert result.exit_code == plain.exit_code == 0 and result.stdout == plain.stdout
    assert result.stderr == ("frtrace: note: -j reads the selected ranks' files in local worker processes "
                             "(--workers); --scheduler only applies to the analysis\n")


def test_an_output_beside_a_url_input_is_planned_not_a_crash(tmp_path):
    """-o is checked before anything is read, against the inputs' folders: a URL has none."""
    result = run(["gs://bucket/job", "-o", tmp_path / "db.sqlite", "--timeline", tmp_path / "nccl_trace_rank_0.json"])
    assert result.exit_code == 2 and "internal error" not in result.stderr
    assert result.stderr.startswith("frtrace: error: reading gs:// URLs needs a package that is not installed")


def test_selected_ranks_and_pg_filters_without_j_or_timeline_are_noted(job):
    result = run([job, "--selected-ranks", "0", "--pg-filters", "tp"])
    assert result.exit_code == 0
    assert "frtrace: note: --selected-ranks and --pg-filters only narrow -j and --timeline" in result.stderr


def test_print_stack_trace_on_dumps_without_frames_is_noted():
    result = run(["-j", "--print-stack-trace", NO_FRAMES])
    assert result.exit_code == 0 and "hold no stack frames" in result.stderr


def test_a_missing_directory_after_pg_filters_is_an_error_not_a_filter(tmp_path, monkeypatch, no_analysis):
    healthy_job(tmp_path)  # a job in the current directory must not be analysed instead
    monkeypatch.chdir(tmp_path)
    result = run(["--pg-filters", "tp", "/typo/dir"])
    assert result.exit_code == 2 and "/typo/dir: no such directory or file" in result.stderr


def test_a_pg_filter_that_looks_like_a_path_is_refused(job, no_analysis):
    result = run([job, "-j", "--pg-filters=tp,typo/dir"])
    assert result.exit_code == 2 and "looks like a path" in result.stderr


def test_a_huge_selected_ranks_range_is_refused_at_once(job, no_analysis):
    result = run(["-j", job, "--selected-ranks", "0-100000000"])
    assert result.exit_code == 2 and "beyond any job" in result.stderr


def test_a_large_selected_ranks_range_keeps_the_ranks_of_the_job(job):
    result = run(["-j", job, "--selected-ranks", "1-1000000"])
    assert result.exit_code == 0
    header = result.stdout.splitlines()[0]
    assert "rank 1" in header and "rank 0" not in header


# --------------------------------------------------------------------------- C: terminals and CI


class _Terminal:
    def isatty(self):
        return True


def test_no_color_turns_colour_off(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Terminal())
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert output._styler() is not None
    monkeypatch.setenv("NO_COLOR", "1")
    assert output._styler() is None


# Runs the real entry point in a child process, with `analyze` or the SQLite writer
# replaced by one that signals the process itself: deterministic, and quick.
SIGNALLING_RUN = """
import os, signal, sys
from frtrace.cli import analyse as cli
from frtrace.cli import main
from frtrace.export import outputs
where, signame = sys.argv[1], sys.argv[2]
def stop(*args, **kwargs):
    if where == "write":
        open(args[0], "wb").write(b"partial")
    os.kill(os.getpid(), getattr(signal, signame))
    import time; time.sleep(5)
if where == "load":
    cli.analyze = stop
else:
    outputs.write_sqlite = stop
main(sys.argv[3:])
"""


def _child(args, **kwargs):
    return subprocess.run([sys.executable, "-c", SIGNALLING_RUN, *map(str, args)], capture_output=True, text=True,
                          timeout=60, **kwargs)


@pytest.mark.parametrize("signame, code, word", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_signals_exit_with_128_plus_the_signal(job, signame, code, word):
    done = _child(["load", signame, job])
    assert done.returncode == code and done.stderr == f"frtrace: {word}\n"


# Issue 26 item 7: SIGHUP, SIGQUIT and SIGUSR1 mid-write left a 70 MB hidden temporary file.
STOP_SIGNALS = [name for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGABRT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                                  "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGPWR", "SIGRTMIN", "SIGRTMAX")
                if hasattr(signal, name)]


@pytest.mark.parametrize("signame", STOP_SIGNALS)
def test_a_signal_mid_write_leaves_no_temporary_file(job, tmp_path, signame):
    done = _child(["write", signame, job, "-o", tmp_path / "db.sqlite"])
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    assert done.stderr == ("frtrace: interrupted\n" if signame == "SIGINT" else "frtrace: terminated\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dumps"]


def _entry_point(args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "frtrace", *map(str, args)], **kwargs)


def test_a_reader_that_went_away_ends_quietly_with_141(job):
    child = _entry_point([job], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # as `| head -1` does once it has its line
    assert child.stderr.read() == b"" and child.wait(timeout=60) == 141


def test_a_closed_stdout_is_said_and_exits_2(job):
    child = _entry_point([job], stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
    assert child.wait(timeout=60) == 2 and b"standard output is closed" in child.stderr.read()


def test_a_full_stdout_says_no_space_left(job):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "frtrace", str(job)], stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 2 and b"no space left on device writing standard output" in done.stderr


# --------------------------------------------------------------------------- D: output safety


def test_force_never_replaces_a_dump_of_another_naming_family(job, no_analysis):
    other = write_json(job / "nccl_trace_rank_0.json", dump([entry(1)]))
    before = other.read_bytes()
    result = run([job, "--timeline", other, "--force"])
    assert result.exit_code == 2 and "refusing to overwrite an input dump file" in result.stderr
    assert other.read_bytes() == before


def test_a_new_output_named_like_a_dump_inside_the_input_directory_is_refused(job, no_analysis):
    result = run([job, "-o", job / "rank_7.pkl", "--force"])
    assert result.exit_code == 2 and "named like a rank dump inside the input" in result.stderr
    assert not (job / "rank_7.pkl").exists()


def test_of_concurrent_writers_without_force_exactly_one_wins(tmp_path):
    target = plan_output(tmp_path / "db.pkl", "database", force=False)
    gate = threading.Barrier(4)
    outcomes = []

    def writer(number: int) -> None:
        def write(tmp: str) -> None:
            Path(tmp).write_text(str(number))
            gate.wait()  # all four finished writing before any links

        try:
            write_atomically(target, write)
            outcomes.append(("won", number))
        except OutputError as exc:
            outcomes.append(("lost", str(exc)))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [n for outcome, n in outcomes if outcome == "won"]
    assert len(winners) == 1 and (tmp_path / "db.pkl").read_text() == str(winners[0])
    assert all("already exists" in message for outcome, message in outcomes if outcome == "lost")
    assert [p.name for p in tmp_path.iterdir()] == ["db.pkl"]


def test_concurrent_runs_to_one_path_report_one_success(job, tmp_path):
    runs = [_entry_point([job, "-o", tmp_path / "db.pkl"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(4)]
    codes = sorted(child.wait(timeout=60) for child in runs)
    assert codes == [0, 2, 2, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.pkl", "dumps"]


# --------------------------------------------------------------------------- discovery and generations


def _hang_dumps(world: int = 4, culprit: int = 3) -> dict:
    return {r: dump([entry(s) for s in (1, 2, 3)] + ([] if r == culprit else [entry(4, state="started")]),
                    ranks=range(world)) for r in range(world)}


def _age(paths, seconds: float) -> None:
    for path in paths:
        stat = path.stat()
        os.utime(path, (stat.st_atime, stat.st_mtime - seconds))


def test_two_generations_in_one_directory_are_not_mixed(tmp_path):
    directory = write_job(tmp_path / "d", _hang_dumps())  # yesterday's hang
    _age(directory.iterdir(), 3600)
    healthy = {r: dump([entry(s) for s in (1, 2)], ranks=range(4)) for r in range(4)}
    for rank, data in healthy.items():  # today's run, written next to it as rank_N.1
        write_json(directory / f"rank_{rank}.1", data)
    result = run([directory, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert "found 2 generations of dumps" in result.stderr and "ranks 0-3" in result.stderr
    skipped = json.loads(result.stdout)["inputs"]["skipped_files"]
    assert sorted(Path(s["path"]).name for s in skipped) == ["rank_0", "rank_1", "rank_2", "rank_3"]
    assert all("another generation" in s["reason"] for s in skipped)


def test_all_generations_reads_them_together_and_then_a_repeated_rank_is_an_error(tmp_path):
    directory = write_job(tmp_path / "d", _hang_dumps())
    _age(directory.iterdir(), 3600)
    write_json(directory / "rank_0.1", dump([entry(1)]))
    result = run([directory, "--all-generations"])
    assert result.exit_code == 2 and "rank 0 has two dump files" in result.stderr


def test_an_own_database_left_among_the_dumps_is_not_a_rank(job, tmp_path):
    elsewhere = tmp_path / "rank_7.pkl"
    assert run([job, "-o", elsewhere]).exit_code == 0
    elsewhere.rename(job / "rank_7.pkl")  # moved in later, by hand
    result = run([job, "--format", "json"])
    assert result.exit_code == 0, result.stdout
    inputs = json.loads(result.stdout)["inputs"]
    assert inputs["ranks_missing"] == [] and inputs["ranks_found"] == [0, 1]
    assert any("frtrace Database pickle" in s["reason"] for s in inputs["skipped_files"])


def test_unrelated_files_with_numbers_are_never_rank_dumps(tmp_path):
    man = tmp_path / "share" / "man" / "man1"
    man.mkdir(parents=True)
    (man / "pg_waldump.1.gz").write_bytes(gzip.compress(b".TH PG_WALDUMP 1\n"))
    (tmp_path / "llvm-objdump-14").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    (tmp_path / "endpoint-rule-set-1.json").write_text('{"version": "1.0", "parameters": {}}')
    result = run([tmp_path])
    assert result.exit_code == 2
    assert result.stderr == f"frtrace: error: no Flight Recorder dump files found in {tmp_path}\n"
