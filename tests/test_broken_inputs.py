"""Broken, odd and oversized inputs: never a crash, always the file and the reason.

Contract checked throughout (DESIGN.md §4/§5): no Python traceback; an unusable file is
named with its reason on stderr (one line); exit 2 when nothing usable is left, and an
unusable file otherwise counts exactly like a missing dump (exit 3 on a job whose other
ranks are healthy). Odd but readable values become warnings, never exceptions.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import random
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    analyse_dicts,
    assert_no_traceback,
    copy_fixture,
    dump,
    entry,
    fixture_dir,
    healthy_dumps,
    no_crash,
    run_cli,
    stderr_lines,
    write_job,
    write_pickle,
)

from frtrace.load.loader import load_one
from frtrace.load.safe_decode import DecodeError, decode_dump_bytes
from frtrace.model import LoadIssue
from frtrace.table.rank_dump import RankDump

MISSING = object()


def healthy_job(directory: Path, world: int = 4) -> Path:
    return write_job(directory, healthy_dumps(world))


def json_dump(data: dict) -> bytes:
    """A dump as torch's JSON writer lays it out (no frames, tuples as lists)."""
    out = dict(data)
    if "entries" in out:
        out["entries"] = [dict(e, frames=[], process_group=list(e["process_group"])) for e in out["entries"]]
    return json.dumps(out).encode()


def assert_counts_as_missing(tmp_path: Path, bad: bytes, *, rank: int = 3, name: str = None) -> object:
    """Put `bad` in place of one rank of a healthy synthetic job: the result must be exactly
    what the job gives with that file deleted (exit 3, rank missing), plus one stderr line
    naming the file."""
    directory = healthy_job(tmp_path / "dumps")
    target = directory / (name or f"rank_{rank}")
    (directory / f"rank_{rank}").unlink()
    target.write_bytes(bad)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout)
    assert report["status"] == "inconclusive"
    assert report["inputs"]["ranks_missing"] == [rank]
    assert [f["path"] for f in report["inputs"]["unreadable_files"]] == [str(target)]
    (line,) = stderr_lines(result)
    assert line.startswith("frtrace: skipped ") and str(target) in line
    return result


def assert_alone_exits_2(tmp_path: Path, bad: bytes, reason: str = "") -> object:
    directory = tmp_path / "alone"
    directory.mkdir()
    (directory / "rank_0").write_bytes(bad)
    result = run_cli([directory, "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 2
    (line,) = stderr_lines(result)
    assert str(directory / "rank_0") in line and reason in line
    assert result.stdout == ""
    return result


def fixture_bytes(name: str, rank: int = 0) -> bytes:
    return (fixture_dir(name) / f"rank_{rank}").read_bytes()


# --------------------------------------------------------------------------- resource limits


def test_max_file_size_refuses_a_big_file_with_a_clear_message(tmp_path):
    dumps = healthy_dumps(4)
    dumps[3]["nccl_comm_state"] = {"padding": "x" * 50_000}  # same entries, a bigger file
    directory = write_job(tmp_path / "dumps", dumps)
    result = run_cli([directory, "--max-file-size", "8K", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code in (1, 3)
    (line,) = stderr_lines(result)
    assert "rank_3" in line and "limit" in line and "--max-file-size" in line
    assert run_cli([directory, "--max-file-size", "1M", "--workers", "1"]).exit_code == 0


@pytest.mark.parametrize("size", ["abc", "12X", "", "1..5M"])
def test_max_file_size_that_is_not_a_size_is_a_usage_error(size, tmp_path):
    result = run_cli([healthy_job(tmp_path / "d"), "--max-file-size", size])
    assert result.exit_code == 2 and "--max-file-size" in result.output
    assert_no_traceback(result)


def test_negative_max_file_size_is_a_usage_error(tmp_path):
    result = run_cli([healthy_job(tmp_path / "d"), "--max-file-size", "-5M"])
    assert result.exit_code == 2 and "Usage" in result.output


def test_a_gzip_bomb_is_refused_without_inflating_it(tmp_path):
    payload = b"\x80\x02" + b"N" * (30 * 1024 * 1024)  # 30 MB inflated ...
    bomb = gzip.compress(payload, compresslevel=9)
    assert len(bomb) < 100_000  # ... from a few kB on disk
    with pytest.raises(DecodeError, match="decompresses to more than"):
        decode_dump_bytes(bomb, 1024 * 1024)
    directory = healthy_job(tmp_path / "dumps")
    (directory / "rank_3").unlink()
    (directory / "rank_3.gz").write_bytes(bomb)
    result = run_cli([directory, "--max-file-size", "1M", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3
    (line,) = stderr_lines(result)
    assert "rank_3.gz" in line and "decompresses to more than" in line and "--max-file-size" in line


@pytest.mark.parametrize("data, reason", [
    (gzip.compress(gzip.compress(pickle.dumps({"version": "2.10"}, protocol=2))), "not a Flight Recorder dump"),
    (gzip.compress(pickle.dumps({"version": "2.10"}, protocol=2))[:-6], "gzip"),
    (gzip.compress(b"") , "empty after gunzip"),
    (gzip.compress(pickle.dumps({"version": "2.10"}, protocol=2)) + b"trailing junk", "gzip"),
    (b"\x1f\x8b" + bytes(30), "gzip"),
], ids=["gzip-in-gzip", "truncated-gzip", "empty-gzip", "trailing-garbage", "bad-header"])
def test_odd_gzip_files_are_named_with_a_reason(data, reason, tmp_path):
    assert_alone_exits_2(tmp_path, data, reason)


def test_deeply_nested_json_is_a_clean_error(tmp_path):
    deep = b'{"version": "2.10", "entries": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_dump_bytes(deep, 10**7)
    assert_alone_exits_2(tmp_path, deep, "nested too deeply")


def _deep_list_pickle(depth: int) -> bytes:
    """Opcodes for a list nested `depth` deep (no recursion needed to write it)."""
    return b"]" * depth + b"a" * (depth - 1)


def _dump_with(placement: str, value_opcodes: bytes) -> bytes:
    """A protocol-2 pickle of a valid 1-entry dump with `value_opcodes` placed somewhere."""
    def t(s):
        raw = s.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw
    good_entry = pickle.dumps(entry(1), protocol=2)[2:-1]  # the dict's opcodes, no PROTO/STOP
    if placement.startswith("entry."):
        field = placement.split(".", 1)[1]
        entry_ops = good_entry + t(field) + value_opcodes + b"s"
        entries = b"]" + entry_ops + b"a"
    elif placement == "entries":
        entries = value_opcodes
    else:
        entries = b"]" + good_entry + b"a"
    ops = b"}" + t("version") + (value_opcodes if placement == "version" else t("2.10")) + b"s"
    ops += t("entries") + entries + b"s"
    if placement in ("pg_config", "unknown_key"):
        ops += t(placement) + value_opcodes + b"s"
    return b"\x80\x02" + ops + b"."


DEEP_PLACEMENTS = ["version", "entries", "pg_config", "unknown_key", "entry.thread_name", "entry.input_sizes",
                   "entry.frames", "entry.record_id", "entry.duration_ms", "entry.profiling_name", "entry.state"]


@pytest.mark.parametrize("placement", DEEP_PLACEMENTS)
def test_a_deeply_nested_pickle_value_is_survived(placement, tmp_path):
    data = _dump_with(placement, _deep_list_pickle(20_000))
    path = tmp_path / "rank_0"
    path.write_bytes(data)
    result = no_crash(load_one, 0, str(path))
    assert isinstance(result, (RankDump, LoadIssue))
    if isinstance(result, LoadIssue):
        assert result.path == str(path) and result.problem
    cli = run_cli([tmp_path, "--workers", "1"])
    assert_no_traceback(cli)


@pytest.mark.parametrize("data, reason", [
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "not a Flight Recorder dump"),
    (b"\x7fELF\x02\x01\x01" + bytes(64), "not a Flight Recorder dump"),
    (b"2026-01-01 12:00:00 INFO training step 12\n", "not a Flight Recorder dump"),
    (b"[rank0]: Watchdog caught collective operation timeout\n", "invalid JSON"),
    (b"   \n\t  ", "not a Flight Recorder dump"),
    (bytes(100), "not a Flight Recorder dump"),
    (b"PK\x03\x04" + bytes(40), "not a Flight Recorder dump"),
    (b"42", "not a Flight Recorder dump"),
    (b"null", "not a Flight Recorder dump"),
    (b'"a string"', "not a Flight Recorder dump"),
], ids=["png", "elf", "log-text", "log-text-bracket", "whitespace", "nul-bytes", "zip", "json-number", "json-null", "json-string"])
def test_a_file_that_is_not_a_dump_is_named(data, reason, tmp_path):
    assert_alone_exits_2(tmp_path, data, reason)
    assert_counts_as_missing(tmp_path / "job", data)


# --------------------------------------------------------------------------- sandboxed runs (hangs, memory)

# Some inputs made frtrace hang or eat memory. They run in a child process with a memory cap
# and a deadline, all at once, so a hang costs a few seconds and never the machine.
# For all of them together: a clean run takes about a second; the margin is for loaded CI machines.
SANDBOX_SECONDS = 20.0
SANDBOX_MEMORY = 256 * 1024 * 1024


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (SANDBOX_MEMORY, SANDBOX_MEMORY))


def _billion_laughs_version() -> bytes:
    # version = ((...2^40 leaves...)) in 250 bytes: any str()/repr() of it never ends.
    ops = b"\x80\x02}X\x07\x00\x00\x00versionX\x03\x00\x00\x00lol" + b"\x85q\x00"
    for level in range(40):
        ops += b"h\x00\x86q\x00"  # (t, t) of the tuple t on the stack, memoised again
    return ops + b"sX\x07\x00\x00\x00entries]s."


# 9 bytes: an empty dict memoised at index 2**27. The C unpickler keeps its memo in an array
# sized by the largest index, so this asks for 2**28 pointers (2 GB), zero-filled.
MEMO_BOMB = b"\x80\x02}r" + (2**27).to_bytes(4, "little") + b"."


def _build_sandbox_cases(root: Path) -> dict:
    cases = {}

    def job(name: str) -> Path:
        return healthy_job(root / name)

    d = job("fifo")
    (d / "rank_3").unlink()
    os.mkfifo(d / "rank_3")
    cases["fifo"] = d

    d = job("dev_zero")
    (d / "rank_3").unlink()
    (d / "rank_3").symlink_to("/dev/zero")
    cases["dev_zero"] = d

    d = job("billion_laughs")
    (d / "rank_3").write_bytes(_billion_laughs_version())
    cases["billion_laughs"] = d

    d = job("huge_rank_in_name")
    (d / "rank_3").rename(d / "rank_99999999999")
    cases["huge_rank_in_name"] = d

    d = job("memo_index_bomb")
    (d / "rank_3").write_bytes(MEMO_BOMB)
    cases["memo_index_bomb"] = d

    d = root / "huge_rank_in_pg_config"
    dumps = healthy_dumps(4)
    dumps[3]["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3, 10000000000]"
    write_job(d, dumps)
    cases["huge_rank_in_pg_config"] = d
    return cases


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("sandbox")
    cases = _build_sandbox_cases(root)
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "frtrace", "--workers", "1", str(d)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=_cap_memory, text=True, errors="replace")
        for name, d in cases.items()
    }
    results = {}
    deadline = time.monotonic() + SANDBOX_SECONDS
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(0.05, deadline - time.monotonic()))
            results[name] = (proc.returncode, out, err, cases[name])
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            results[name] = ("timeout", out, err, cases[name])
    return results


def _assert_sandboxed_clean(result, named: str, codes=(1, 2, 3)):
    code, out, err, _ = result
    assert code != "timeout", "frtrace hung"
    assert "internal error" not in err and "Traceback" not in err, err
    assert code in codes, (code, err)
    assert named in err + out


def test_a_fifo_named_like_a_dump_does_not_hang(sandbox):
    _assert_sandboxed_clean(sandbox["fifo"], "rank_3")


def test_a_symlink_to_a_device_is_refused_not_read_forever(sandbox):
    _assert_sandboxed_clean(sandbox["dev_zero"], "rank_3")


def test_a_billion_laughs_pickle_does_not_hang(sandbox):
    # With the sandbox's memory cap the str() dies of MemoryError after seconds; without it, it
    # takes the machine's memory. A 242-byte file must be read without either.
    # Its version is unreadable and its entry list empty, but its peers completed every op
    # with it: healthy (0) is a fair verdict, as long as the odd file is named.
    _assert_sandboxed_clean(sandbox["billion_laughs"], "rank_3", codes=(0, 1, 2, 3))
    assert "MemoryError" not in sandbox["billion_laughs"][2]


def test_an_absurd_rank_number_in_a_file_name_is_survived(sandbox):
    _assert_sandboxed_clean(sandbox["huge_rank_in_name"], "99999999999")


def test_a_memo_index_bomb_is_refused_without_the_memory(sandbox):
    code, out, err, _ = sandbox["memo_index_bomb"]
    _assert_sandboxed_clean(sandbox["memo_index_bomb"], "rank_3")
    assert "memory" not in err.lower(), err


def test_an_absurd_rank_in_pg_config_is_survived(sandbox):
    code, out, err, _ = sandbox["huge_rank_in_pg_config"]
    assert code != "timeout" and "internal error" not in err and code in (0, 1, 3), (code, err)


# --------------------------------------------------------------------------- truncated, empty, random


@pytest.mark.parametrize("fraction", [0.0001, 0.01, 0.25, 0.5, 0.9, 0.999, "minus1", "minus2"])
@pytest.mark.parametrize("scenario", ["hang_never_arrives", "cascade_tp_dp_json"])
def test_a_truncated_real_dump_is_named_as_truncated(scenario, fraction, tmp_path):
    data = fixture_bytes(scenario, 1)
    cut = len(data) - int(fraction[5:]) if isinstance(fraction, str) else max(1, int(len(data) * fraction))
    path = tmp_path / "rank_1"
    path.write_bytes(data[:cut])
    issue = load_one(1, str(path))
    assert isinstance(issue, LoadIssue) and issue.path == str(path)
    assert ("truncated" in issue.problem) if data[:1] == b"\x80" else ("invalid JSON" in issue.problem)


@pytest.mark.parametrize("scenario, rank", [("hang_never_arrives", 2), ("hang_never_arrives", 0), ("cascade_tp_dp", 5)])
def test_a_truncated_rank_on_a_real_job_counts_as_missing(scenario, rank, tmp_path):
    missing = copy_fixture(scenario, tmp_path / "missing")
    (missing / f"rank_{rank}").unlink()
    expected = run_cli([missing, "--format", "json", "--workers", "1"])
    broken = copy_fixture(scenario, tmp_path / "broken")
    data = (broken / f"rank_{rank}").read_bytes()
    (broken / f"rank_{rank}").write_bytes(data[: len(data) // 2])
    result = run_cli([broken, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == expected.exit_code
    got, want = json.loads(result.stdout), json.loads(expected.stdout)
    assert (got["status"], got["suspect_ranks"]) == (want["status"], want["suspect_ranks"])
    assert [(f["kind"], f["ranks"]) for f in got["findings"]] == [(f["kind"], f["ranks"]) for f in want["findings"]]
    assert len(stderr_lines(result)) == 1 and f"rank_{rank}" in result.stderr and "truncated" in result.stderr


def test_the_next_step_for_a_missing_dump_names_only_the_missing_rank(tmp_path):
    result = assert_counts_as_missing(tmp_path, b"")
    for finding in json.loads(result.stdout)["findings"]:
        if finding["kind"] == "missing_dump" and finding["next_step"]:
            assert "rank(s) 3 " in finding["next_step"], finding["next_step"]


def test_an_empty_file_is_named(tmp_path):
    assert_alone_exits_2(tmp_path, b"", "empty file")
    assert_counts_as_missing(tmp_path / "job", b"")


@pytest.mark.parametrize("prefix", [b"", b"\x80\x02", b"\x80\x05", b"{", b"[", b"\x1f\x8b\x08\x00"])
@pytest.mark.parametrize("seed", range(4))
def test_random_bytes_never_crash(prefix, seed, tmp_path):
    rng = random.Random(seed)
    data = prefix + rng.randbytes(rng.randrange(1, 4096))
    path = tmp_path / "rank_0"
    path.write_bytes(data)
    result = load_one(0, str(path))
    assert isinstance(result, (RankDump, LoadIssue))
    cli = run_cli([tmp_path, "--workers", "1"])
    assert_no_traceback(cli)
    assert cli.exit_code in (0, 1, 2, 3)


@pytest.mark.parametrize("scenario", ["hang_never_arrives", "healthy_2rank_json", "cascade_tp_dp"])
def test_bit_flips_of_a_real_dump_never_crash(scenario, tmp_path):
    original = fixture_bytes(scenario, 1)
    rng = random.Random(scenario)
    path = tmp_path / "rank_1"
    outcomes = set()
    for _ in range(60):
        data = bytearray(original)
        for _ in range(rng.choice((1, 1, 2, 8))):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        result = no_crash(load_one, 1, str(path))
        assert isinstance(result, (RankDump, LoadIssue))
        outcomes.add(type(result).__name__)
    assert outcomes  # at least one kind of outcome; both usually occur


def test_bit_flipped_ranks_on_a_real_job_never_crash_the_cli(tmp_path):
    directory = copy_fixture("hang_never_arrives", tmp_path / "d")
    rng = random.Random(7)
    originals = {p: p.read_bytes() for p in directory.iterdir()}
    for _ in range(6):
        for path, original in originals.items():
            data = bytearray(original)
            for _ in range(3):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
        result = run_cli([directory, "--workers", "1"])
        assert_no_traceback(result)
        assert result.exit_code in (0, 1, 2, 3)


@pytest.mark.parametrize("data", [
    b"{not json", b'{"version": "2.10", "entries": [', b'{"version": "2.10"} trailing', b'{"version": "2.10",}',
    b"{'version': '2.10'}", b'{"version": "2.10", "entries": [' + b"9" * 5000 + b"]}",
], ids=["garbage", "cut", "trailing", "trailing-comma", "single-quotes", "5000-digit-number"])
def test_invalid_json_is_named(data, tmp_path):
    assert_alone_exits_2(tmp_path, data, "invalid JSON")
    assert_counts_as_missing(tmp_path / "job", data)


def test_a_json_dump_with_a_utf8_bom_is_read(tmp_path):
    data = healthy_dumps(2)
    write_job(tmp_path, {0: data[0]})
    (tmp_path / "rank_1").write_bytes(b"\xef\xbb\xbf" + json_dump(data[1]))
    result = run_cli([tmp_path, "--workers", "1"])
    assert result.exit_code == 0 and result.stderr == ""


# --------------------------------------------------------------------------- wrong shapes


@pytest.mark.parametrize("data, reason", [
    (json.dumps("hello").encode(), ""),
    (json.dumps({"rank": 3, "log": "x"}).encode(), "no Flight Recorder keys"),
    (pickle.dumps("a string", protocol=2), "top level is a str"),
    (pickle.dumps(42, protocol=2), "top level is a int"),
    (pickle.dumps(None, protocol=2), "top level is a NoneType"),
    (pickle.dumps({"rank": 3}, protocol=2), "no Flight Recorder keys"),
    (pickle.dumps({1: 2, (3,): 4}, protocol=2), "no Flight Recorder keys"),
], ids=["json-string", "json-dict-no-fr-keys", "pickle-string", "pickle-int", "pickle-none", "pickle-dict-no-fr-keys",
        "pickle-dict-odd-keys"])
def test_data_of_the_wrong_shape_is_named(data, reason, tmp_path):
    assert_alone_exits_2(tmp_path, data, reason)
    assert_counts_as_missing(tmp_path / "job", data)


@pytest.mark.parametrize("data", [json.dumps([1, 2, 3]).encode(), pickle.dumps([1, "x", None], protocol=2)],
                         ids=["json", "pickle"])
def test_a_list_of_ints_is_not_a_dump(data, tmp_path):
    assert_alone_exits_2(tmp_path, data)
    assert_counts_as_missing(tmp_path / "job", data)


@pytest.mark.parametrize("entries", ["abc", 42, {"0": {}}, [1, 2, 3]], ids=["str", "int", "dict", "list-of-ints"])
def test_a_dump_whose_entries_are_unusable_counts_as_missing(entries, tmp_path):
    data = pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries}, protocol=2)
    assert_counts_as_missing(tmp_path, data)


# --------------------------------------------------------------------------- wrong types, field by field

ENTRY_FIELDS = ["record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
                "time_created_ns", "duration_ms", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
                "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "timeout_ms",
                "is_p2p", "thread_id", "thread_name", "frames"]
OTHER_TARGETS = {
    "version": ("version",), "comm_lib_version": ("comm_lib_version",), "pg_config": ("pg_config",),
    "pg_status": ("pg_status",), "pg_config.0": ("pg_config", "0"), "pg_config.0.name": ("pg_config", "0", "name"),
    "pg_config.0.desc": ("pg_config", "0", "desc"), "pg_config.0.ranks": ("pg_config", "0", "ranks"),
    "pg_status.0": ("pg_status", "0"), "pg_status.0.last_enqueued_collective": ("pg_status", "0", "last_enqueued_collective"),
    "pg_status.0.last_completed_collective": ("pg_status", "0", "last_completed_collective"),
    "frame.name": ("entries", 1, "frames", 0, "name"), "frame.filename": ("entries", 1, "frames", 0, "filename"),
    "frame.line": ("entries", 1, "frames", 0, "line"), "frame": ("entries", 1, "frames", 0),
}
TARGETS = {**{f"entry.{f}": ("entries", 1, f) for f in ENTRY_FIELDS}, **OTHER_TARGETS}
VALUES = {
    "numeric-str": "2", "str": "abc", "none": None, "list": [1], "dict": {"a": 1}, "huge-int": 10**5000,
    "negative": -5, "nan": math.nan, "bool": True, "bytes": b"\xff\xfe", "unicode-digit": "\u00b2", "missing": MISSING,
}
UNHASHABLE = ("list", "dict")
INT_FIELDS = ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns",
              "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms")
def _known_bug(target: str, value: str):
    """Crashes not fixed yet, as a reason for a strict xfail (none at the moment)."""
    return None


def _cases():
    for target in TARGETS:
        for value in VALUES:
            bug = _known_bug(target, value)
            marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
            yield pytest.param(target, value, marks=marks, id=f"{target}={value}")


def _put(data: dict, path: tuple, value) -> None:
    *head, last = path
    for key in head:
        data = data[key]
    if value is MISSING:
        if isinstance(data, dict):
            data.pop(last, None)
        else:
            del data[last]
    else:
        data[last] = value


def _job_with(target: str, value) -> dict:
    dumps = healthy_dumps(4)
    for d in dumps.values():
        d["pg_status"] = {"0": {"last_enqueued_collective": 3, "last_started_collective": -1, "last_completed_collective": 3}}
        d["entries"] = [dict(e, frames=[dict(f) for f in e["frames"]]) for e in d["entries"]]
    _put(dumps[1], TARGETS[target], value)
    return dumps


@pytest.mark.parametrize("target, value", list(_cases()))
def test_a_wrong_type_in_any_field_never_crashes(target, value):
    analysis, diagnosis = no_crash(analyse_dicts, _job_with(target, VALUES[value]))
    assert diagnosis.status in ("healthy", "faults", "inconclusive")
    assert [d.rank for d in analysis.load.dumps] == [0, 1, 2, 3]


@pytest.mark.parametrize("target, value, warning", [
    ("entry.input_sizes", "str", "input_sizes"), ("entry.output_sizes", "dict", "output_sizes"),
    ("entry.collective_seq_id", "str", "collective_seq_id"), ("entry.record_id", "list", "record_id"),
    ("entry.process_group", "dict", "process_group"), ("entry.frames", "str", "frames"),
    ("entry.input_dtypes", "list", "input_dtypes"), ("pg_config", "list", "pg_config"),
    ("pg_status.0", "str", "pg_status"),
    ("pg_status.0.last_completed_collective", "str", "last_completed_collective"),
])
def test_a_wrong_type_is_reported_as_a_warning_of_that_rank(target, value, warning):
    analysis, _ = analyse_dicts(_job_with(target, VALUES[value]))
    warnings = {d.rank: d.warnings for d in analysis.load.dumps}
    assert any(warning in w for w in warnings[1]), warnings[1]
    assert not warnings[0] and not warnings[2]


@pytest.mark.parametrize("target, value", [
    ("entry.collective_seq_id", "none"), ("entry.collective_seq_id", "str"), ("entry.collective_seq_id", "missing"),
    ("entry.profiling_name", "none"), ("entry.profiling_name", "missing"), ("entry.input_sizes", "str"),
    ("entry.output_sizes", "dict"),
])
def test_one_unreadable_field_does_not_make_a_healthy_job_faulty(target, value):
    _, diagnosis = analyse_dicts(_job_with(target, VALUES[value]))
    assert diagnosis.status != "faults", diagnosis.verdict


def test_an_unreadable_op_name_is_not_compared_when_loaded_by_worker_processes(tmp_path):
    # Entries cross from loader workers by pickle: "unreadable" must survive that trip.
    dumps = healthy_dumps(8)
    del dumps[1]["entries"][1]["profiling_name"]
    result = run_cli([write_job(tmp_path / "d", dumps), "--workers", "2", "--format", "json"])
    assert json.loads(result.stdout)["status"] != "faults", result.stdout


@pytest.mark.parametrize("field, value", [
    ("input_sizes", [["16"]]), ("collective_seq_id", "2"), ("p2p_seq_id", None), ("process_group", {"name": "0"}),
    ("record_id", 10**40), ("time_created_ns", -1), ("state", 7), ("retired", "yes"), ("timeout_ms", 2.5),
])
def test_cli_on_wrong_types_in_real_files_gives_a_report(field, value, tmp_path):
    dumps = healthy_dumps(4)
    for d in dumps.values():
        for e in d["entries"]:
            e[field] = value
    directory = write_job(tmp_path / "d", dumps)
    for fmt in ("text", "json", "markdown"):
        result = run_cli([directory, "--format", fmt, "--workers", "1"])
        assert_no_traceback(result)
        assert result.exit_code in (0, 1, 3)
        if fmt == "json":
            json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


@pytest.mark.parametrize("ranks", ["[-1, 0, 1, 2, 3]", "[0, 1, 'x']", "[[0, 1]]", "0-3", "[0, 1, 2, 3", "[True, 1]",
                                   "__import__('os').system('touch MARKER')", "[" * 10_000 + "]" * 10_000])
def test_odd_pg_config_rank_strings_are_survived(ranks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dumps = healthy_dumps(4)
    dumps[2]["pg_config"]["0"]["ranks"] = ranks
    analysis, diagnosis = analyse_dicts(dumps)
    assert diagnosis.status in ("healthy", "inconclusive")
    assert not (tmp_path / "MARKER").exists()


def test_duplicate_frames_and_odd_frame_entries_are_survived():
    dumps = healthy_dumps(4)
    dumps[1]["entries"][0]["frames"] = [{"name": "a"}, 5, None, {"filename": "f", "line": "12"}, {}]
    analysis, diagnosis = analyse_dicts(dumps)
    assert diagnosis.status == "healthy"


# --------------------------------------------------------------------------- non-UTF-8 and surrogates


def test_non_utf8_bytes_in_a_pickled_name_are_named_not_a_crash(tmp_path):
    # torch's C++ pickler writes std::string bytes as they are (e.g. a thread name cut
    # mid-character at 15 bytes): Python cannot decode that BINUNICODE.
    good = pickle.dumps(healthy_dumps(4)[3], protocol=2)
    assert b"pt_nccl_watchdog" in good
    bad = good.replace(b"pt_nccl_watchdog", b"pt_nccl_watch\xe2\x82\x00")
    result = assert_counts_as_missing(tmp_path, bad)
    assert "utf-8" in result.stderr.lower() or "corrupt" in result.stderr


def test_non_utf8_bytes_in_a_json_dump_are_named(tmp_path):
    bad = json_dump(healthy_dumps(4)[3]).replace(b"default_pg", b"default\xff\xfepg")
    assert_counts_as_missing(tmp_path, bad)


def _surrogate_job(directory: Path) -> Path:
    dumps = {}
    for rank in range(4):
        entries = [entry(s, pg=("0", "dp\udcff")) for s in (1, 2, 3)]
        if rank != 3:
            entries.append(entry(4, pg=("0", "dp\udcff"), state="started"))
        dumps[rank] = dump(entries, ranks=range(4))
    directory.mkdir(parents=True)
    for rank, data in dumps.items():
        (directory / f"rank_{rank}").write_bytes(json_dump(data))  # json.dumps writes "\udcff" escapes
    return directory


# click's CliRunner encodes stdout strictly, unlike a real run (click.echo replaces what the
# terminal or pipe cannot take), so these run as real processes, all at once.
SURROGATE_RUNS = {
    "text": ["--format", "text"], "json": ["--format", "json"], "markdown+pkl": ["--format", "markdown", "-o", "db.pkl"],
    "raw": ["-j", "--print-stack-trace"], "sqlite": ["-o", "db.sqlite"], "timeline": ["--timeline", "trace.json.gz"],
}


@pytest.fixture(scope="module")
def surrogate_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("surrogates")
    directory = _surrogate_job(root / "d")
    procs = {name: subprocess.Popen([sys.executable, "-m", "frtrace", "--workers", "1", str(directory)] + args,
                                    cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, args in SURROGATE_RUNS.items()}
    return {name: (proc.communicate(timeout=60), proc.returncode, root) for name, proc in procs.items()}


@pytest.mark.parametrize("name", ["text", "json", "markdown+pkl", "raw"])
def test_lone_surrogates_in_names_are_survived_by_reports(name, surrogate_runs):
    (out, err), code, root = surrogate_runs[name]
    assert b"internal error" not in err and b"Traceback" not in err, err
    assert code == (0 if name == "raw" else 1) and b"dp" in out
    if name == "json":
        assert json.loads(out)["status"] == "faults"
    if name == "markdown+pkl":
        assert (root / "db.pkl").exists()


@pytest.mark.parametrize("name, output", [("sqlite", "db.sqlite"), ("timeline", "trace.json.gz")])
def test_lone_surrogates_in_names_are_survived_by_exports(name, output, surrogate_runs):
    (out, err), code, root = surrogate_runs[name]
    assert b"internal error" not in err, err
    assert code == 1 and (root / output).exists()


# --------------------------------------------------------------------------- missing keys, extra keys, old formats


@pytest.mark.parametrize("field", ENTRY_FIELDS)
def test_a_key_missing_on_every_rank_keeps_a_healthy_job_healthy(field):
    dumps = healthy_dumps(4)
    for d in dumps.values():
        for e in d["entries"]:
            e.pop(field, None)
    _, diagnosis = analyse_dicts(dumps)
    # Without its sequence number no entry can be lined up with its peers', and these
    # dumps have no pg_status: no evidence either way is not health. Without its op name
    # nothing of an entry can be compared (which sizes may differ depends on the op):
    # unknown is not agreement.
    expected = "inconclusive" if field in ("collective_seq_id", "profiling_name") else "healthy"
    assert diagnosis.status == expected, diagnosis.verdict


@pytest.mark.parametrize("key", ["pg_config", "pg_status", "comm_lib_version", "version"])
def test_a_top_level_key_missing_on_every_rank_is_survived(key):
    dumps = healthy_dumps(4)
    for d in dumps.values():
        d.pop(key, None)
    _, diagnosis = analyse_dicts(dumps)
    assert diagnosis.status == "healthy", diagnosis.verdict


def test_extra_unknown_keys_are_ignored(tmp_path):
    dumps = healthy_dumps(4)
    for d in dumps.values():
        d["nccl_comm_state"] = {"comm0": {"abort": False, "nested": [[{"x": None}]]}}
        d["future_top_level"] = [1, {"a": (2, 3)}]
        for e in d["entries"]:
            e["split_sizes"] = [[1, 2], [3]]
            e["new_field_2_12"] = {"anything": [None, 1.5, "x"]}
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(result.stdout)["inputs"]["warnings"] == []


def _old(d: dict, style: str):
    if style == "bare-list":
        return d["entries"]
    out = dict(d, entries=[dict(e) for e in d["entries"]])
    if style in ("seq_id", "2.0"):
        for e in out["entries"]:
            e["seq_id"] = e.pop("collective_seq_id")
    if style == "2.0":
        out["version"] = "2.0"
        out["nccl_version"] = out.pop("comm_lib_version")
        for e in out["entries"]:
            for key in ("p2p_seq_id", "op_id", "process_group", "is_p2p", "thread_id", "thread_name", "retired",
                        "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms"):
                e.pop(key, None)
    if style == "2.11":
        out["version"] = "2.11"
        for e in out["entries"]:
            e["input_split_sizes"], e["output_split_sizes"] = [4, 4, 4, 4], [4, 4, 4, 4]
    return out


@pytest.mark.parametrize("style", ["bare-list", "seq_id", "2.0", "2.11"])
def test_old_and_new_formats_on_every_rank_stay_healthy(style, tmp_path):
    dumps = {r: _old(d, style) for r, d in healthy_dumps(4).items()}
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["inputs"]["ranks_found"] == [0, 1, 2, 3]


def test_mixed_versions_across_ranks_stay_healthy(tmp_path):
    base = healthy_dumps(4)
    dumps = {0: base[0], 1: _old(base[1], "seq_id"), 2: _old(base[2], "2.11"), 3: _old(base[3], "bare-list")}
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert result.exit_code == 0, result.stdout
    assert {"2.10", "2.11"} <= set(json.loads(result.stdout)["inputs"]["versions"])


def test_mixed_pickle_json_and_gzip_ranks_stay_healthy(tmp_path):
    dumps = healthy_dumps(4)
    directory = tmp_path / "d"
    directory.mkdir()
    write_pickle(directory / "rank_0", dumps[0])
    (directory / "rank_1.json").write_bytes(json_dump(dumps[1]))
    (directory / "rank_2.pkl.gz").write_bytes(gzip.compress(pickle.dumps(dumps[2], protocol=2)))
    (directory / "rank_3.json.gz").write_bytes(gzip.compress(json_dump(dumps[3])))
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["inputs"]["encodings"] == ["json", "json+gzip", "pickle", "pickle+gzip"]


# --------------------------------------------------------------------------- discovery: ranks, dirs, links


@pytest.mark.parametrize("first, second", [("rank_0", "rank_0.json"), ("a/rank_0", "b/rank_0"), ("rank_1", "rank_01")])
def test_two_files_for_one_rank_is_exit_2_naming_both(first, second, tmp_path):
    directory = healthy_job(tmp_path / "d")
    if first == "a/rank_0":
        (directory / "rank_0").unlink()
    for name in (first, second):
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        write_pickle(directory / name, healthy_dumps(4)[0])
    result = run_cli([directory, "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 2
    (line,) = stderr_lines(result)
    assert str(directory / first) in line and str(directory / second) in line


def test_gaps_in_rank_numbers_are_missing_ranks(tmp_path):
    dumps = healthy_dumps(6)
    directory = write_job(tmp_path / "d", {r: dumps[r] for r in (0, 1, 5)})
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3
    report = json.loads(result.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1, 5] and report["inputs"]["ranks_missing"] == [2, 3, 4]


def test_gaps_without_pg_config_still_count_the_ranks_in_between(tmp_path):
    dumps = {r: dump([entry(s) for s in (1, 2, 3)]) for r in (0, 2, 3)}  # pg_config ranks "[]"
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["inputs"]["ranks_missing"] == [1]


def test_an_unused_group_with_empty_ranks_and_a_missing_rank_is_survived(tmp_path):
    groups = {"a": {"name": "a", "desc": "tp", "ranks": "[]"}, "b": {"name": "b", "desc": "tp", "ranks": "[]"}}
    dumps = {r: {"version": "2.10", "pg_config": groups, "entries": [entry(1, pg=("a", "tp"))]} for r in (0, 2, 3)}
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code in (0, 1, 3)


def test_an_empty_directory_is_exit_2(tmp_path):
    result = run_cli([tmp_path, "--workers", "1"])
    assert result.exit_code == 2 and "no Flight Recorder dump files found" in result.stderr
    assert len(stderr_lines(result)) == 1


def test_a_directory_of_unrelated_files_is_exit_2(tmp_path):
    (tmp_path / "train.log").write_text("step 1\n")
    (tmp_path / "core.1234").write_bytes(b"\x7fELF")
    (tmp_path / ".hidden_rank_0").write_bytes(pickle.dumps(healthy_dumps(1)[0], protocol=2))
    result = run_cli([tmp_path, "--workers", "1"])
    assert_no_traceback(result)
    # With no dump-like name at all, core.1234 is the only candidate and is tried (and refused).
    assert result.exit_code == 2 and len(stderr_lines(result)) == 1
    assert "no Flight Recorder dump files found" in result.stderr or "core.1234: not a Flight Recorder dump" in result.stderr


def test_a_path_that_does_not_exist_is_exit_2(tmp_path):
    result = run_cli([tmp_path / "nope", "--workers", "1"])
    assert result.exit_code == 2 and "nope" in result.stderr
    assert_no_traceback(result)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_named(tmp_path):
    directory = healthy_job(tmp_path / "d")
    (directory / "rank_3").chmod(0)
    try:
        result = run_cli([directory, "--workers", "1"])
    finally:
        (directory / "rank_3").chmod(0o644)
    assert result.exit_code == 3 and "rank_3" in result.stderr and "cannot read" in result.stderr


def test_a_file_that_fails_while_being_read_is_named(tmp_path):
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("no /proc")
    directory = healthy_job(tmp_path / "d")
    (directory / "rank_3").unlink()
    (directory / "rank_3").symlink_to("/proc/self/mem")  # open() works, read() at offset 0 fails (EIO)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3 and "rank_3" in result.stderr


def test_symlink_loops_neither_hang_nor_crash(tmp_path):
    directory = healthy_job(tmp_path / "d")
    (directory / "sub").mkdir()
    (directory / "sub" / "loop").symlink_to("..", target_is_directory=True)
    (directory / "sub" / "self").symlink_to(directory / "sub", target_is_directory=True)
    (directory / "rank_3").unlink()
    (directory / "rank_3").symlink_to("rank_3")  # a file link to itself
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3
    report = json.loads(result.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1, 2]
    assert [f["path"] for f in report["inputs"]["unreadable_files"]] == [str(directory / "rank_3")]
    (line,) = stderr_lines(result)
    assert "rank_3" in line


def test_a_dangling_symlink_is_named_and_a_good_one_followed(tmp_path):
    elsewhere = healthy_job(tmp_path / "elsewhere")
    directory = healthy_job(tmp_path / "d")
    (directory / "rank_2").unlink()
    (directory / "rank_2").symlink_to(elsewhere / "rank_2")
    (directory / "rank_3").unlink()
    (directory / "rank_3").symlink_to(tmp_path / "gone")
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["inputs"]["ranks_found"] == [0, 1, 2]
    assert "rank_3" in result.stderr


def test_a_directory_named_like_a_rank_file_is_not_a_dump(tmp_path):
    directory = healthy_job(tmp_path / "d")
    (directory / "rank_3").unlink()
    (directory / "rank_3").mkdir()
    (directory / "rank_4.pkl").mkdir()
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3
    assert json.loads(result.stdout)["inputs"]["ranks_missing"] == [3]


def test_a_directory_given_as_a_file_input_and_a_file_given_twice(tmp_path):
    directory = healthy_job(tmp_path / "d")
    result = run_cli([directory / "rank_0", directory / "rank_0", "-d", directory / "rank_1", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code in (0, 2, 3)


# --------------------------------------------------------------------------- odd but healthy: never fooled

HEALTHY_FIXTURES = ["ring_wrap_uneven", "overlapping_groups_healthy", "uneven_alltoall_healthy", "coalesced_healthy",
                    "healthy_no_entries", "healthy_2rank", "healthy_8rank_mesh"]


@pytest.mark.parametrize("scenario", HEALTHY_FIXTURES + [f"{name}_json" for name in HEALTHY_FIXTURES])
def test_odd_looking_healthy_fixtures_stay_healthy(scenario):
    result = run_cli([fixture_dir(scenario), "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report["summary"]
    assert report["status"] == "healthy" and report["suspect_ranks"] == []
    assert not [f for f in report["findings"] if f["severity"] == "error"]


SYNTH_HEALTHY = {
    "wrapped-7": dict(world_size=8, tp=2, pp=2, steps=4, buffer_size=7),
    "wrapped-20-timing": dict(world_size=8, tp=2, pp=2, steps=4, buffer_size=20, timing=True),
    "lookahead-2": dict(world_size=8, tp=2, pp=2, steps=3, lookahead=2),
    "lookahead-2-timing-wrapped": dict(world_size=16, tp=4, pp=2, steps=3, lookahead=2, timing=True, buffer_size=30),
    "timing": dict(world_size=8, tp=2, pp=2, steps=3, timing=True),
    "no-frames": dict(world_size=8, tp=2, pp=2, steps=3, with_frames=False),
    "version-2.0": dict(world_size=8, tp=2, pp=2, steps=3, version="2.0"),
    "dp-only": dict(world_size=4, tp=1, pp=1, steps=3, timing=True, lookahead=2),
}


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("name", sorted(SYNTH_HEALTHY))
def test_synthetic_healthy_jobs_stay_healthy(name, fmt, tmp_path):
    from frtrace.testing.synth import generate
    from frtrace.testing.synth import write_job as synth_write_job

    job = generate(seed=3, **SYNTH_HEALTHY[name])
    assert job.truth["status"] == "healthy"
    synth_write_job(job, tmp_path, fmt=fmt)
    result = run_cli([tmp_path, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 0, json.loads(result.stdout)["summary"]


def _healthy_variant(world: int, build) -> dict:
    return {rank: dump(build(rank), ranks=range(world)) for rank in range(world)}


NCCL_ODD_HEALTHY = {
    # monitored_barrier and friends leave the same gaps in the sequence on every rank
    "seq-gaps-on-all-ranks": lambda r: [entry(s) for s in (1, 2, 3, 5, 6, 9)],
    "gloo-seq-gaps": lambda r: [entry(s, backend="gloo", state="scheduled", retired=True) for s in (1, 2, 4, 5)],
    # the newest op is finishing: done on some ranks, started (timing) or still scheduled on others
    "in-flight-timed": lambda r: [_timed_entry(s, done=s < 5 or r < 2) for s in range(1, 6)],
    "in-flight-untimed": lambda r: [entry(s, state="completed" if s < 5 or r < 2 else "scheduled") for s in range(1, 6)],
    # ring buffers wrapped at different points: only the overlap is compared
    "different-windows": lambda r: [entry(s, record_id=s + 100) for s in range(1 + 2 * r, 12)],
    # legitimately rank-dependent shapes
    "uneven-all-to-all": lambda r: [entry(1, "all_to_all_single", sizes=((4 + r,),)), entry(2)],
    "scatter-gather-roots": lambda r: [
        entry(1, "scatter", sizes=((2,),), input_sizes=[[2]] * 4 if r == 0 else []),
        entry(2, "gather", sizes=((2,),), output_sizes=[[2]] * 4 if r == 0 else [])],
    "v-ops": lambda r: [entry(1, "all_gather_v", sizes=((r + 1,),)), entry(2, "reduce_scatter_v", sizes=((r + 3,),))],
    # unknown names, backends, threads and clocks that differ per rank
    "unknown-op-and-backend": lambda r: [entry(1, "my_custom_op", backend="hccl"), entry(2, "all_reduce", backend="ncclx")],
    "skewed-clocks-threads": lambda r: [entry(s, time_ns=10**18 + s * 10**6 + r * 37 * 10**9, thread_id=str(r),
                                              thread_name=f"t{r}") for s in (1, 2, 3)],
    "p2p-pairs": lambda r: [entry(1), entry(1, "send 0->1" if r == 0 else "recv 1<-0", p2p_seq=1) if r < 2 else None,
                            entry(2)],
    "coalesced-batch": lambda r: [entry(1, "all_reduce", record_id=0), entry(1, "all_reduce", record_id=1),
                                  entry(1, "coalesced", record_id=2), entry(2, record_id=3)],
}


def _timed_entry(seq: int, done: bool) -> dict:
    from helpers import _timed

    return _timed(entry(seq), 10 * seq, 10 * seq + 2 if done else None)


@pytest.mark.parametrize("name", sorted(NCCL_ODD_HEALTHY))
def test_hand_built_odd_but_healthy_jobs_stay_healthy(name, tmp_path):
    build = NCCL_ODD_HEALTHY[name]
    dumps = _healthy_variant(4, lambda r: [e for e in build(r) if e is not None])
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report["summary"]
    assert report["suspect_ranks"] == []


def test_a_rank_without_entries_is_not_blamed_for_ops_its_peers_completed(tmp_path):
    dumps = healthy_dumps(4)
    del dumps[3]["entries"]
    directory = write_job(tmp_path / "d", dumps)
    result = run_cli([directory, "--workers", "1"])
    assert result.exit_code in (0, 3), result.stdout


def test_a_rank_dumped_without_collectives_while_its_peers_wait_is_weighed_like_a_missing_dump(tmp_path):
    # Ranks 0-2 wait in all_reduce #4; rank 3 was dumped with includeCollectives=False. Its
    # dump says nothing about #4, so "every member issued it" (stuck) would be a guess: the
    # silent rank is the prime suspect, as a rank without a dump would be.
    dumps = {r: dump([entry(s) for s in (1, 2, 3)] + [entry(4, state="started")], ranks=range(4)) for r in range(3)}
    dumps[3] = dump([], ranks=range(4))
    del dumps[3]["entries"]
    result = run_cli([write_job(tmp_path / "d", dumps), "--workers", "1", "--format", "json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["suspect_ranks"] == [3]
    assert [f["kind"] for f in report["findings"] if f["severity"] == "error"] == ["missing_dump"]


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_lookahead_does_not_change_the_culprit_of_a_hang(lookahead, tmp_path):
    from frtrace.testing.synth import Fault, generate
    from frtrace.testing.synth import write_job as synth_write_job

    job = generate(8, 2, 2, steps=3, timing=True, lookahead=lookahead, fault=Fault("hang", rank=5, group="tp", step=2))
    assert job.truth["suspect_ranks"] == [5]
    synth_write_job(job, tmp_path)
    report = json.loads(run_cli([tmp_path, "--format", "json", "--workers", "1"]).stdout)
    assert report["suspect_ranks"] == [5], report["summary"]
