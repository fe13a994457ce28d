"""Hardening, round 2 (issue 16): small hostile files next to a healthy job.

Each input is crafted here, opcode by opcode or dict by dict. The contract: the bad
file is named in one line, the rest of the job is still analysed, the exit code says
so, and work stays linear in the file. Sizes are chosen so that the quadratic code
these tests replaced would take minutes, while the linear code takes well under a
second; no test times anything.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import sqlite3
import struct
import subprocess
import sys
import zlib
from collections import defaultdict

import pytest
from helpers import (
    assert_no_traceback,
    deep_tuple_key_dump,
    dump,
    entry,
    healthy_dumps,
    memo_reference_dump,
    pickle_text,
    run_cli,
    stderr_lines,
    write_job,
)

from frtrace.export.timeline import _assign_lanes, _Slice
from frtrace.load.loader import DEFAULT_MAX_ENTRIES, load_one, normalise_dump, parse_profiling_name
from frtrace.load.safe_decode import (
    MAX_GZIP_RATIO,
    SAFE_TUPLE_OPCODES,
    decode_dump_bytes,
    may_nest_too_deeply,
)
from frtrace.table.by_group import deal_by_group
from frtrace.model import Entry, LoadIssue, PgConfig, Shapes
from frtrace.table.rank_dump import RankDump

# --------------------------------------------------------------------------- helpers


def healthy_pair(directory):
    """A healthy 2-rank job; tests add their hostile file as rank 2."""
    return write_job(directory, healthy_dumps(2))


def json_report(args) -> tuple:
    result = run_cli([*args, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    return result, json.loads(result.stdout) if result.stdout else None


# --------------------------------------------------------------------------- quadratic paths


def _one_entry_dump(count: int, seq: int = 1) -> RankDump:
    """`count` entries of one rank, all under collective_seq_id `seq`."""
    template = Entry(0, 0, "0", "default_pg", 0, seq, 0, 0, parse_profiling_name("nccl:all_reduce"), Shapes((), (), (), ()),
                     "completed", True, 0, None, None, None, None, ())
    entries = tuple(template._replace(index=i, record_id=i, op_id=i) for i in range(count))
    return RankDump(0, "rank_0", "pickle", "2.10", "", (), {}, entries, True)


def test_many_entries_under_one_sequence_number_are_dealt_in_linear_time():
    # 300,000 entries in one batch: growing the batch tuple per entry copies 4.5e10 pointers.
    dealt = deal_by_group(_one_entry_dump(300_000).entries)
    (batch,) = dealt["0"].by_sequence.values()
    assert len(batch) == 300_000 and batch[0].index == 0 and batch[-1].index == 299_999


def test_a_rank_with_one_sequence_number_for_every_entry_is_analysed(tmp_path):
    directory = healthy_pair(tmp_path / "job")
    entries = [entry(1, record_id=i, frames=[]) for i in range(20_000)]
    write_job(directory, {2: dump(entries, ranks=range(2))})
    result, report = json_report([directory])
    assert result.exit_code in (1, 3), result.output
    assert report["inputs"]["ranks_found"] == [0, 1, 2]


def _first_fit(slices: list) -> list:
    """The lane rule spelled out: the first lane whose last slice has ended."""
    ends: dict = defaultdict(list)
    lanes = []
    for s in slices:
        group = ends[s.group_id]
        lane = next((n for n, end in enumerate(group) if end <= s.start), len(group))
        group[lane:lane + 1] = [s.end]
        lanes.append(lane)
    return lanes


def test_lanes_are_the_first_free_lane_as_before():
    rng = random.Random(16)
    for _ in range(200):
        slices = []
        for _ in range(rng.randrange(1, 40)):
            start = rng.randrange(0, 100)
            slices.append(_Slice(start, start + rng.randrange(1, 30), None, rng.randrange(3), "", "", ()))
        slices.sort(key=lambda s: (s.start, s.end))
        assert _assign_lanes(slices) == _first_fit(slices)


def test_ops_that_never_completed_get_lanes_in_linear_time():
    # 100,000 ops open until the dump time: trying every open lane per op is 5e9 steps.
    count = 100_000
    slices = [_Slice(i, count + 10, None, 0, "", "", ()) for i in range(count)]
    slices.append(_Slice(count + 10, count + 20, None, 0, "", "", ()))  # after all of them: lane 0 again
    lanes = _assign_lanes(slices)
    assert lanes[:count] == list(range(count)) and lanes[-1] == 0


def test_a_timeline_of_many_never_completed_ops_is_written(tmp_path):
    directory = healthy_pair(tmp_path / "job")
    entries = [entry(i + 1, state="scheduled", retired=False, frames=[]) for i in range(3_000)]
    write_job(directory, {2: dump(entries, ranks=range(3))})
    trace = tmp_path / "trace.json"
    result = run_cli([directory, "--workers", "1", "--timeline", trace])
    assert_no_traceback(result)
    assert result.exit_code in (1, 3)
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 3}
    # The first op never completed, so the others sat queued behind it: instants, not lanes.
    assert len(tracks) == 1
    assert sum(1 for e in events if e.get("cat") == "queued" and e["pid"] == 3) == 2_999


# --------------------------------------------------------------------------- SQLite export

BIG_INTEGERS = [2**63 - 1, 2**63, 2**64 - 1, -(2**63) - 1, -(2**64) + 1]


def _job_with_big_integers(directory):
    """Healthy 2-rank job whose ids, timestamps and line numbers sit at the edges of 64 bits."""
    dumps = healthy_dumps(2)
    for data in dumps.values():
        for number, record in enumerate(data["entries"]):
            big = BIG_INTEGERS[number % len(BIG_INTEGERS)]
            record.update(record_id=big + number if big < 0 else big - number, time_created_ns=big, timeout_ms=big,
                          time_discovered_completed_ns=BIG_INTEGERS[2])
            record["frames"] = [dict(frame, line=big) for frame in record["frames"]]
    return write_job(directory, dumps)


def test_integers_beyond_64_bits_are_exported_losslessly(tmp_path):
    directory = _job_with_big_integers(tmp_path / "job")
    out = tmp_path / "db.sqlite"
    result = run_cli([directory, "--workers", "1", "-o", out])
    assert_no_traceback(result)
    assert result.exit_code in (0, 1, 3), result.output
    with sqlite3.connect(out) as conn:
        stored = conn.execute("SELECT CAST(time_created_ns AS TEXT), typeof(time_created_ns), CAST(timeout_ms AS TEXT), "
                              "CAST(time_completed_ns AS TEXT) FROM ncclcalls").fetchall()
        lines = {row[0] for row in conn.execute("SELECT CAST(line AS TEXT) FROM frames")}
    assert {int(created) for created, _, _, _ in stored} == set(BIG_INTEGERS[:3])
    assert all(created == timeout for created, _, timeout, _ in stored)
    assert {completed for *_, completed in stored} == {str(2**64 - 1)}
    # In range stays an INTEGER; beyond it, the digits as a BLOB (TEXT would become a lossy REAL).
    assert {(int(created), kind) for created, kind, _, _ in stored} == {
        (2**63 - 1, "integer"), (2**63, "blob"), (2**64 - 1, "blob")}
    assert {int(line) for line in lines} <= set(BIG_INTEGERS) and str(2**64 - 1) in lines


def _sqlite_rows(path) -> tuple:
    with sqlite3.connect(path) as conn:
        rows = list(conn.iterdump())
        root = conn.execute("SELECT value FROM meta WHERE key = 'input_root'").fetchone()[0]
        paths = conn.execute("SELECT path FROM ranks ORDER BY rank").fetchall()
    return [row for row in rows if "'input_root'" not in row], root, paths


def test_the_same_dumps_in_two_layouts_give_the_same_database(tmp_path, monkeypatch):
    first = write_job(tmp_path / "a" / "dumps", healthy_dumps(3))
    second = write_job(tmp_path / "b" / "deeper" / "dumps", healthy_dumps(3))
    (second / "rank_2").unlink()
    (second / "rank_2").write_bytes(b"not a dump")  # and an unreadable file, named in ranks.problem
    (first / "rank_2").write_bytes(b"not a dump")
    monkeypatch.chdir(tmp_path / "b")
    outputs = []
    for directory, name in ((first, "one"), (second.relative_to(tmp_path / "b"), "two")):
        out = tmp_path / f"{name}.sqlite"
        assert_no_traceback(run_cli([directory, "--workers", "1", "-o", out]))
        outputs.append(_sqlite_rows(out))
    (rows_one, root_one, paths_one), (rows_two, root_two, paths_two) = outputs
    assert rows_one == rows_two
    assert paths_one == paths_two == [("rank_0",), ("rank_1",), (None,)]
    assert root_one == str(first) and root_two == "deeper/dumps"


def test_files_given_one_by_one_are_relative_to_their_common_directory(tmp_path):
    directory = write_job(tmp_path / "job", healthy_dumps(2))
    (directory / "sub").mkdir()
    (directory / "rank_1").rename(directory / "sub" / "rank_1")
    out = tmp_path / "db.sqlite"
    assert_no_traceback(run_cli([directory / "rank_0", directory / "sub" / "rank_1", "--workers", "1", "-o", out]))
    _, root, paths = _sqlite_rows(out)
    assert root == str(directory) and paths == [("rank_0",), ("sub/rank_1",)]


# --------------------------------------------------------------------------- memory and time bombs


def assert_rank_2_skipped(directory, reason: str) -> dict:
    """The hostile rank_2 is named in one stderr line with `reason`; ranks 0 and 1 are analysed."""
    result, report = json_report([directory])
    assert result.exit_code == 3, result.output
    assert report["inputs"]["ranks_found"] == [0, 1] and report["inputs"]["ranks_missing"] == [2]
    (line,) = stderr_lines(result)
    assert str(directory / "rank_2") in line and reason in line, line
    return report


def test_millions_of_memo_references_to_one_entry_are_refused(tmp_path):
    data = memo_reference_dump(4_000_000)
    assert len(data) < 16_000
    directory = healthy_pair(tmp_path / "job")
    (directory / "rank_2").write_bytes(data)
    assert_rank_2_skipped(directory, f"holds 4,000,001 entries, over the limit of {DEFAULT_MAX_ENTRIES:,}")


def test_a_bare_list_of_memo_references_is_refused_too(tmp_path):
    one_entry = pickle.dumps(entry(1), protocol=2)[2:-1]
    data = gzip.compress(b"\x80\x02]" + one_entry + b"q\x01a(" + b"h\x01" * 1_000_000 + b"e.")
    directory = healthy_pair(tmp_path / "job")
    (directory / "rank_2").write_bytes(data)
    assert_rank_2_skipped(directory, "over the limit")


def _gzip_bomb(inflated: int) -> bytes:
    """A gzip'd pickle of `{"version": <inflated bytes of zeros>}`, compressed a block at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    head = b"\x80\x02}" + pickle_text("version") + b"\x8e" + struct.pack("<Q", inflated)  # BINBYTES8
    parts = [packer.compress(head)]
    block = bytes(1 << 22)
    for _ in range(inflated // len(block)):
        parts.append(packer.compress(block))
    parts += [packer.compress(b"s."), packer.flush()]
    return b"".join(parts)


def test_a_gzip_bomb_under_the_size_limit_is_refused_by_its_ratio(tmp_path):
    data = _gzip_bomb(128 << 20)  # 128 MB from about 130 KB: 1,000 times
    assert len(data) * MAX_GZIP_RATIO < 128 << 20
    directory = healthy_pair(tmp_path / "job")
    (directory / "rank_2").write_bytes(data)
    assert_rank_2_skipped(directory, f"decompresses to more than {MAX_GZIP_RATIO} times its")


def test_a_small_gzip_file_may_inflate_past_the_ratio_up_to_the_floor():
    data, encoding = decode_dump_bytes(gzip.compress(pickle.dumps(dump([entry(1)] * 2000), protocol=2)), 10**9)
    assert encoding == "pickle+gzip" and len(data["entries"]) == 2000


# --------------------------------------------------------------------------- nesting


def _frtrace(*args) -> subprocess.CompletedProcess:
    """The CLI in a process of its own: if a file still crashed it, this test process lives on."""
    # With a fault handler on, as `python -X faulthandler` or pytest would leave it: a crash
    # in the child must still cost one line.
    return subprocess.run([sys.executable, "-m", "frtrace", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONFAULTHANDLER": "1"})


@pytest.mark.parametrize("via_memo", [False, True], ids=["tuple-opcodes", "memo-chain"])
def test_a_tuple_nested_a_million_deep_costs_only_its_file(via_memo, tmp_path):
    data = deep_tuple_key_dump(1_000_000, via_memo)
    assert len(data) < 10_000
    directory = healthy_pair(tmp_path / "job")
    (directory / "rank_2").write_bytes(data)
    run = _frtrace(directory, "--workers", "1", "--format", "json")
    assert run.returncode == 3, run.stderr
    report = json.loads(run.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1] and report["inputs"]["ranks_missing"] == [2]
    (line,) = run.stderr.splitlines()
    assert str(directory / "rank_2") in line and "nested too deeply" in line and "SIGSEGV" in line


def test_a_deep_tuple_among_many_files_spares_the_worker_pool(tmp_path):
    directory = write_job(tmp_path / "job", healthy_dumps(8))
    (directory / "rank_8").write_bytes(deep_tuple_key_dump(1_000_000))
    run = _frtrace(directory, "--workers", "2", "--format", "json")
    assert run.returncode == 3, run.stderr
    assert "BrokenProcessPool" not in run.stderr and "internal error" not in run.stderr
    assert json.loads(run.stdout)["inputs"]["ranks_missing"] == [8]


def test_load_one_names_the_file_whose_decoding_crashed(tmp_path):
    path = tmp_path / "rank_0"
    path.write_bytes(deep_tuple_key_dump(1_000_000, via_memo=True))
    issue = load_one(0, str(path))
    assert isinstance(issue, LoadIssue) and issue.path == str(path) and "nested too deeply" in issue.problem


def test_an_honest_pickle_with_many_tuple_bytes_decodes_alike_in_a_separate_process(tmp_path):
    dumps = healthy_dumps(2)
    dumps[0]["entries"][0]["thread_name"] = "t" * (SAFE_TUPLE_OPCODES + 1)  # 't' is TUPLE's byte
    data = pickle.dumps(dumps[0], protocol=2)
    assert may_nest_too_deeply(data)
    path = tmp_path / "rank_0"
    path.write_bytes(data)
    loaded = load_one(0, str(path))
    assert isinstance(loaded, RankDump)
    assert loaded.entries == normalise_dump(dumps[0], 0, str(path), "pickle").entries
    assert loaded.pg_config == ((PgConfig("0", "default_pg", (0, 1)),))


# --------------------------------------------------------------------------- the world's size


def _claims_ranks(dumps: dict, rank: int, count: int) -> dict:
    dumps[rank]["pg_config"]["0"]["ranks"] = str(list(range(count)))
    return dumps


def test_one_rank_listing_100000_ranks_does_not_inflate_a_healthy_job(tmp_path):
    dumps = _claims_ranks(healthy_dumps(3), 2, 100_000)
    for rank in (0, 1):
        dumps[rank]["pg_config"]["0"]["ranks"] = "[0, 1, 2]"
    directory = write_job(tmp_path / "job", dumps)
    result, report = json_report([directory])
    assert result.exit_code == 0, result.output
    assert report["inputs"]["world_size"] == 3 and report["inputs"]["ranks_missing"] == []
    assert len(result.stdout) < 10_000
    (warning,) = report["inputs"]["warnings"]
    assert warning["rank"] == 2 and "99,997 rank(s) (3, 4, 5 ...)" in warning["warning"]


def test_a_lone_claim_next_to_dumps_without_rank_lists_is_not_believed_either(tmp_path):
    dumps = healthy_dumps(3)  # their pg_config lists no ranks, as gloo writes it
    _claims_ranks(dumps, 2, 100_000)
    directory = write_job(tmp_path / "job", dumps)
    result, report = json_report([directory])
    assert report["inputs"]["world_size"] == 3 and report["inputs"]["ranks_missing"] == []


def test_world_size_option_backs_a_claim(tmp_path):
    dumps = _claims_ranks(healthy_dumps(3), 2, 100_000)
    directory = write_job(tmp_path / "job", dumps)
    result, report = json_report([directory, "--world-size", "5"])
    assert report["inputs"]["world_size"] == 5 and report["inputs"]["ranks_missing"] == [3, 4]


def test_ranks_two_dumps_list_are_believed_without_files(tmp_path):
    dumps = {rank: _claims_ranks(healthy_dumps(8), rank, 8)[rank] for rank in (0, 1)}
    directory = write_job(tmp_path / "job", dumps)
    result, report = json_report([directory])
    assert report["inputs"]["world_size"] == 8 and report["inputs"]["ranks_missing"] == [2, 3, 4, 5, 6, 7]
    assert report["inputs"]["warnings"] == []


def test_a_lone_dump_is_believed_about_its_world(tmp_path):
    directory = write_job(tmp_path / "job", {0: _claims_ranks(healthy_dumps(8), 0, 8)[0]})
    result, report = json_report([directory])
    assert report["inputs"]["world_size"] == 8 and report["inputs"]["ranks_missing"] == [1, 2, 3, 4, 5, 6, 7]


def test_thousands_of_same_described_groups_in_one_pg_config_are_read_in_linear_time():
    # Issue 16 item 3: 24,000 groups of one description, the sibling index once took
    # O(G^2) (188 s); every group's family is now read only when a finding asks.
    from helpers import analyse_dicts, job

    dumps = job({0: ["all_reduce"] * 4, 1: ["all_reduce"] * 4})
    config = dumps[0]["pg_config"]
    for i in range(24_000):
        config[f"g{i}"] = {"name": f"g{i}", "desc": "tp", "ranks": "[0, 1]"}
    analysis, diagnosis = analyse_dicts(dumps, render=False)
    assert diagnosis.status == "healthy", diagnosis.verdict
    assert len(analysis.layout.groups) == 24_001
