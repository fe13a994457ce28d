"""-j at scale and on hostile dumps: only the selected files are read, per-rank blocks
end with each rank's newest entry, lines stay short, dump strings cannot drive the terminal."""

import functools

import pytest
from click.testing import CliRunner
from helpers import dump, entry, gloo_job, write_job
from helpers import job as job_dicts

from frtrace.cli.analyse import frtrace
from frtrace.load import loader
from frtrace.load.loader import discover_dump_files, iter_dump_files
from frtrace.report.raw_view import SIDE_BY_SIDE_MAX, render_block
from frtrace.wording import printable


def run(args):
    result = CliRunner().invoke(frtrace, list(map(str, args)))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def job(tmp_path, world=4, steps=3, pg=("0", "default_pg"), op="all_reduce"):
    dumps = {r: dump([entry(s, pg=pg, op=op) for s in range(1, steps + 1)], ranks=range(world)) for r in range(world)}
    return write_job(tmp_path / "dumps", dumps)


@pytest.fixture
def decoded(monkeypatch):
    """The paths the loader decoded."""
    paths = []
    original = loader.load_one

    def spy(rank, path, *args, **kwargs):
        paths.append(path)
        return original(rank, path, *args, **kwargs)

    monkeypatch.setattr(loader, "load_one", spy)
    return paths


@pytest.mark.parametrize("layout", [[], ["--per-rank"]])
def test_selected_ranks_read_only_their_files(tmp_path, decoded, layout):
    directory = job(tmp_path)
    (directory / "rank_3").write_bytes(b"\x80\x02corrupt beyond repair")
    result = run(["-j", directory, "--workers", "1", "--selected-ranks", "0", "1", *layout])
    assert result.exit_code == 0, result.output
    assert sorted(p.rsplit("/", 1)[1] for p in decoded) == ["rank_0", "rank_1"]
    assert "rank_3" not in result.stderr and "skipped" not in result.stderr
    assert "rank 0" in result.stdout and "rank 1" in result.stdout and "rank 2" not in result.stdout


def test_the_side_by_side_rows_align_among_the_selected_ranks(tmp_path, decoded):
    directory = job(tmp_path, world=16)
    result = run(["-j", directory, "--workers", "1", "--selected-ranks", "5", "9"])
    assert len(decoded) == 2
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["group", "seq", "rank", "5", "rank", "9"]
    assert sum(line.startswith("0 (default_pg)") and line.count("all_reduce") == 2 for line in lines) == 3


def test_the_per_rank_block_ends_with_the_ranks_newest_entry(tmp_path):
    dumps = {r: dump([entry(s) for s in range(1, 31)], ranks=range(2)) for r in range(2)}
    # rank 1 went on alone into #31 of another group: its newest entry.
    dumps[1]["entries"].append(entry(31, record_id=30, pg=("1", "tp"), pg_id=1, op="all_gather", state="scheduled"))
    directory = write_job(tmp_path / "d", dumps)
    result = run(["-j", directory, "--selected-ranks", "1", "--per-rank", "--last", "5"])
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0].startswith("rank 1: 31 entries in ")
    assert "26 older entries not shown" in lines[1]
    newest = lines[-1].split()
    assert newest[0] == "30" and newest[1] == "0.000s" and "all_gather" in newest and newest[-1] == "scheduled"
    assert [line.split()[0] for line in lines[-5:]] == ["26", "27", "28", "29", "30"]


def test_last_0_shows_every_entry(tmp_path):
    result = run(["-j", job(tmp_path, steps=30), "--selected-ranks", "2", "--per-rank", "--last", "0"])
    assert "not shown" not in result.stdout
    assert sum(" all_reduce " in line for line in result.stdout.splitlines()) == 30


def test_wide_selections_get_one_short_block_per_rank(tmp_path):
    world = SIDE_BY_SIDE_MAX + 4
    long_group = ("g" * 300, "d" * 300)
    directory = job(tmp_path, world=world, pg=long_group, op="x" * 500)
    result = run(["-j", directory])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 200
    assert sum(line.startswith("rank ") for line in lines) == world
    assert "rank 0  " not in result.stdout  # no side-by-side header


def test_side_by_side_refuses_more_ranks_than_it_can_show(tmp_path):
    result = run(["-j", job(tmp_path, world=SIDE_BY_SIDE_MAX + 1), "--side-by-side"])
    assert result.exit_code == 2 and f"at most {SIDE_BY_SIDE_MAX} ranks" in result.stderr


@pytest.mark.parametrize("layout", [[], ["--per-rank"]])
def test_control_characters_in_dump_strings_are_escaped(tmp_path, layout):
    hostile = ("tp\x1b[2J\x1b[H\nrank 0: all fine\r", "desc\x9b31m\u202e")
    directory = job(tmp_path, pg=hostile, op="all_reduce\x07\x1b]0;title\x07")
    result = run(["-j", directory, *layout])
    assert result.exit_code == 0
    out = result.stdout
    assert not any(ch in out for ch in "\x1b\x07\r\x9b\u202e")
    assert "tp\\x1b[2J\\x1b[H\\x0arank 0" in out and "all_reduce\\x07\\x1b]0;title" in out
    assert not any(line.startswith("rank 0: all fine") for line in out.splitlines())


def test_printable_escapes_controls_and_keeps_text():
    assert printable("plain é 中") == "plain é 中"
    assert printable("a\x1b[31mb\nc\x7f\x85\u2028\udcff") == "a\\x1b[31mb\\x0ac\\x7f\\x85\\u2028\\udcff"


def test_workers_render_blocks_in_file_order(tmp_path):
    directory = job(tmp_path, world=9)
    files = discover_dump_files([directory]).files
    render = functools.partial(render_block, pg_filters=(), last=2)
    results = list(iter_dump_files(files, workers=2, transform=render))
    assert [rank for rank, _ in results] == list(range(9))
    assert all(block.text.startswith(f"rank {rank}: 3 entries") for rank, block in results)


def test_streaming_can_stop_early(tmp_path):
    directory = job(tmp_path, world=9)
    files = discover_dump_files([directory]).files
    stream = iter_dump_files(files, workers=2)
    assert next(stream)[0] == 0
    stream.close()  # a reader gone: the pool is shut down without waiting


def test_a_reader_that_stops_leaves_no_worker_behind(tmp_path):
    import os
    import subprocess
    import sys
    import time

    directory = job(tmp_path, world=64)
    proc = subprocess.Popen([sys.executable, "-m", "frtrace", "-j", "--per-rank", "--workers", "2", str(directory)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"rank 0: ")
    proc.stdout.close()
    assert proc.wait(timeout=30) == 141
    # stderr reaches its end only when no worker process holds it open any more.
    os.set_blocking(proc.stderr.fileno(), False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if os.read(proc.stderr.fileno(), 65536) == b"":
                break
        except BlockingIOError:
            time.sleep(0.05)
    else:
        pytest.fail("a worker process outlived frtrace")
    proc.stderr.close()


@pytest.mark.parametrize("world", [128, 131_072])
def test_the_columns_are_the_ranks_with_dumps_never_the_claimed_world(tmp_path, world):
    # Issue 26 item 5: 2 dumps of a 128-rank job drew 128 columns (1,527-character lines); a
    # claimed world of 131,072 printed nothing in 300 s.
    directory = write_job(tmp_path / "dumps", {r: dump([entry(s) for s in (1, 2, 3)], ranks=range(world)) for r in (0, 5)})
    for selection in ([], ["--selected-ranks", f"0-{world - 1}"], ["--selected-ranks", "0-4"]):
        result = run(["-j", directory, "--workers", "1", *selection])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        shown = [0] if selection and selection[1] == "0-4" else [0, 5]
        assert lines[0].split() == ["group", "seq"] + [word for r in shown for word in ("rank", str(r))]
        assert max(map(len, lines)) < 200


def test_gloo_ops_read_retired_as_in_the_report(tmp_path):
    """gloo's only completion signal is `retired`, which it also gives an op that timed out:
    -j says `retired` there, as the report does, and `completed` only where a dump says so."""
    write_job(tmp_path / "gloo", gloo_job({0: ["all_reduce", "all_reduce"], 1: ["all_reduce"]}))
    table = run(["-j", tmp_path / "gloo"]).output
    first, second = [line for line in table.splitlines() if line.startswith("0 (default_pg)")]
    assert first.count("retired") == 2 and "completed" not in table
    assert "-- not issued --" in second
    write_job(tmp_path / "nccl", {r: dump([entry(1)]) for r in range(2)})
    assert "completed" in run(["-j", tmp_path / "nccl"]).output


def test_p2p_rows_say_which_ranks_are_global_and_which_in_the_group(tmp_path):
    """Group 1 holds global ranks 2 and 3: the row's channel is global (2->3), the op keeps
    torch's group-local names (send 0->1), and a legend under the table says so."""
    steps = {2: [("send 0->1@pp", {"state": "completed"})], 3: [("recv 1<-0@pp", {"state": "completed"})]}
    write_job(tmp_path, job_dicts(steps, groups={"pp": ("pp", [2, 3])}, world=4))
    out = run(["-j", tmp_path]).output
    (row,) = [line for line in out.splitlines() if "p2p 2->3" in line]
    assert "send 0->1" in row and "recv 1<-0" in row
    assert "seq column names global ranks" in out and "group-local ranks" in out
    block = run(["-j", tmp_path, "--per-rank"]).output
    assert "op (group ranks)" in block
