"""Hostile pickles: every opcode that can reach code or a class is refused, and nothing runs.

Each payload is written opcode by opcode. If it ran it would create a marker file (through
`os.system('touch MARKER')`, `builtins.exec`, `subprocess.Popen`, or the `helpers.Tripwire`
class / `helpers.tripwire` function). A positive control proves, with the standard
unpickler, that each payload really does create its marker; the tests then prove that
frtrace's loader refuses it, names the file and the reason, and runs nothing.
"""

from __future__ import annotations

import copyreg
import json
import os
import pickle
import shlex
import struct
import threading
import time

import pytest
from helpers import (
    assert_no_traceback,
    copy_fixture,
    healthy_dumps,
    run_cli,
    stderr_lines,
    write_job,
)

from frtrace.load.loader import load_dumps, load_one
from frtrace.load.safe_decode import DecodeError, decode_dump_bytes
from frtrace.model import LoadIssue

# --------------------------------------------------------------------------- opcodes

MARK, STOP, REDUCE, BUILD, INST, OBJ = b"(", b".", b"R", b"b", b"i", b"o"
NEWOBJ, NEWOBJ_EX, STACK_GLOBAL = b"\x81", b"\x92", b"\x93"
EXT1, EXT2, EXT4 = b"\x82", b"\x83", b"\x84"
PERSID, BINPERSID = b"P", b"Q"
EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE = b"}", b"]", b")"
APPEND, APPENDS, SETITEM, SETITEMS = b"a", b"e", b"s", b"u"
TUPLE1, TUPLE2 = b"\x85", b"\x86"


def proto(n: int) -> bytes:
    return b"\x80" + bytes([n])


def text(s: str) -> bytes:
    """BINUNICODE (protocol 1+)."""
    raw = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def stack_global(module: str, name: str) -> bytes:
    return text(module) + text(name) + STACK_GLOBAL


def as_dump(hostile: bytes) -> bytes:
    """`{"version": "2.10", "entries": [<hostile>]}`: a payload hidden inside a dump."""
    return EMPTY_DICT + MARK + text("version") + text("2.10") + text("entries") + EMPTY_LIST + hostile + APPEND + SETITEMS


def shell(marker) -> str:
    return f"touch {shlex.quote(str(marker))}"


# Extension codes registered by the tests (unusual values, removed again after each test).
EXT_CODES = {"ext1": 0xF1, "ext2": 0xF1F1, "ext4": 0x7FFFFFF1}


def ext(kind: str) -> bytes:
    code = EXT_CODES[kind]
    if kind == "ext1":
        return EXT1 + bytes([code])
    if kind == "ext2":
        return EXT2 + struct.pack("<H", code)
    return EXT4 + struct.pack("<i", code)


# name -> (lowest protocol, body(marker) -> the opcodes that leave one object on the stack)
PAYLOADS = {
    "GLOBAL posix.system + REDUCE": (2, lambda m: global_("posix", "system") + text(shell(m)) + TUPLE1 + REDUCE),
    "GLOBAL os.system + REDUCE": (2, lambda m: global_("os", "system") + text(shell(m)) + TUPLE1 + REDUCE),
    "GLOBAL builtins.exec + REDUCE": (
        2, lambda m: global_("builtins", "exec") + text(f"open({str(m)!r}, 'w').close()") + TUPLE1 + REDUCE),
    "GLOBAL builtins.eval + REDUCE": (
        2, lambda m: global_("builtins", "eval") + text(f"__import__('pathlib').Path({str(m)!r}).touch()") + TUPLE1 + REDUCE),
    "getattr(__import__('os'), 'system') gadget": (
        2, lambda m: global_("builtins", "getattr") + global_("builtins", "__import__") + text("os") + TUPLE1 + REDUCE
        + text("system") + TUPLE2 + REDUCE + text(shell(m)) + TUPLE1 + REDUCE),
    "STACK_GLOBAL subprocess.Popen + REDUCE": (
        4, lambda m: stack_global("subprocess", "Popen") + EMPTY_LIST + MARK + text("touch") + text(str(m)) + APPENDS
        + TUPLE1 + REDUCE),
    "STACK_GLOBAL helpers.tripwire + REDUCE": (4, lambda m: stack_global("helpers", "tripwire") + text(str(m)) + TUPLE1 + REDUCE),
    "INST posix.system": (2, lambda m: MARK + text(shell(m)) + INST + b"posix\nsystem\n"),
    "INST helpers.Tripwire": (2, lambda m: MARK + text(str(m)) + INST + b"helpers\nTripwire\n"),
    "OBJ posix.system": (2, lambda m: MARK + global_("posix", "system") + text(shell(m)) + OBJ),
    "OBJ STACK_GLOBAL helpers.Tripwire": (4, lambda m: MARK + stack_global("helpers", "Tripwire") + text(str(m)) + OBJ),
    "NEWOBJ helpers.Tripwire": (2, lambda m: global_("helpers", "Tripwire") + text(str(m)) + TUPLE1 + NEWOBJ),
    "NEWOBJ_EX helpers.Tripwire": (
        4, lambda m: stack_global("helpers", "Tripwire") + text(str(m)) + TUPLE1 + EMPTY_DICT + NEWOBJ_EX),
    "BUILD helpers.Tripwire.__setstate__": (
        2, lambda m: global_("helpers", "Tripwire") + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT + text("marker") + text(str(m))
        + SETITEM + BUILD),
}
EXT_PAYLOADS = {kind: (2, lambda m, kind=kind: ext(kind) + text(shell(m)) + TUPLE1 + REDUCE) for kind in EXT_CODES}


def payload(name: str, marker, protocol: int = None, wrapped: bool = False) -> bytes:
    lowest, body = {**PAYLOADS, **EXT_PAYLOADS}[name]
    inner = body(marker)
    return proto(protocol or lowest) + (as_dump(inner) if wrapped else inner) + STOP


def wait_for(path, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.01)
    return path.exists()


@pytest.fixture
def marker(tmp_path, request):
    path = tmp_path / "MARKER"
    yield path
    if "Popen" in request.node.name:
        time.sleep(0.05)  # Popen runs asynchronously: give it a moment to show up
    assert not path.exists(), "a hostile pickle ran code"


# What each test extension code stands for (copyreg wants one (module, name) per code).
EXT_TARGETS = {"ext1": ("posix", "system"), "ext2": ("os", "system"), "ext4": ("subprocess", "getoutput")}


@pytest.fixture
def registered_extensions():
    """Register the EXT1/EXT2/EXT4 test codes; always unregister (which also empties
    copyreg's cache of them)."""
    for kind, (module, name) in EXT_TARGETS.items():
        copyreg.add_extension(module, name, EXT_CODES[kind])
    try:
        yield
    finally:
        for kind, (module, name) in EXT_TARGETS.items():
            copyreg.remove_extension(module, name, EXT_CODES[kind])


# --------------------------------------------------------------------------- positive controls


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_control_each_payload_runs_under_the_standard_unpickler(name, tmp_path):
    ran = tmp_path / "RAN"
    try:
        pickle.loads(payload(name, ran))
    except Exception:  # noqa: BLE001 - some payloads fail after they have run (e.g. Popen of a list)
        pass
    assert wait_for(ran), f"control: payload {name!r} did not run, so the test would prove nothing"


@pytest.mark.parametrize("kind", sorted(EXT_CODES))
def test_control_ext_payloads_run_when_the_code_is_registered(kind, tmp_path, registered_extensions):
    ran = tmp_path / "RAN"
    try:
        pickle.loads(payload(kind, ran))
    except Exception:  # noqa: BLE001
        pass
    assert wait_for(ran)
    # That load cached the code in copyreg._extension_cache; the fixture's remove_extension clears it.


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "inside-a-dump"])
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_decode_refuses_every_code_reaching_opcode(name, wrapped, marker):
    data = payload(name, marker, wrapped=wrapped)
    with pytest.raises(DecodeError, match="refused") as err:
        decode_dump_bytes(data, 10**6)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("name", ["GLOBAL posix.system + REDUCE", "NEWOBJ helpers.Tripwire",
                                  "BUILD helpers.Tripwire.__setstate__", "STACK_GLOBAL helpers.tripwire + REDUCE",
                                  "NEWOBJ_EX helpers.Tripwire"])
def test_decode_refuses_under_every_pickle_protocol(name, protocol, marker):
    with pytest.raises(DecodeError, match="refused"):
        decode_dump_bytes(payload(name, marker, protocol=protocol, wrapped=True), 10**6)


@pytest.mark.parametrize("kind", sorted(EXT_CODES))
def test_unregistered_extension_codes_are_a_clean_error(kind, marker):
    with pytest.raises(DecodeError):
        decode_dump_bytes(payload(kind, marker, wrapped=True), 10**6)


@pytest.mark.parametrize("kind", sorted(EXT_CODES))
def test_registered_extension_codes_are_refused(kind, marker, registered_extensions):
    with pytest.raises(DecodeError, match="refused"):
        decode_dump_bytes(payload(kind, marker, wrapped=True), 10**6)


@pytest.mark.parametrize("kind", sorted(EXT_CODES))
def test_extension_codes_already_in_copyregs_cache_are_refused_too(kind, marker, registered_extensions):
    pickle.loads(proto(2) + ext(kind) + STOP)  # any ordinary unpickle of that code fills the cache
    with pytest.raises(DecodeError, match="refused"):
        decode_dump_bytes(payload(kind, marker, wrapped=True), 10**6)
    assert not marker.exists()


@pytest.mark.parametrize("opcodes", [
    pytest.param(PERSID + shell("MARKER").encode() + b"\n", id="PERSID"),
    pytest.param(text(shell("MARKER")) + BINPERSID, id="BINPERSID"),
    pytest.param(as_dump(PERSID + b"0\n"), id="PERSID-inside-a-dump"),
    pytest.param(as_dump(text("0") + BINPERSID), id="BINPERSID-inside-a-dump"),
])
def test_persistent_ids_are_refused(opcodes):
    with pytest.raises(DecodeError, match="persistent"):
        decode_dump_bytes(proto(2) + opcodes + STOP, 10**6)


@pytest.mark.parametrize("opcodes, why", [
    (EMPTY_DICT + EMPTY_DICT + text("k") + text("v") + SETITEM + BUILD, "BUILD on a plain dict"),
    (EMPTY_LIST + EMPTY_DICT + text("append") + text("x") + SETITEM + BUILD, "BUILD on a plain list"),
    (EMPTY_LIST + MARK + EMPTY_DICT + text("k") + text("v") + SETITEM + EMPTY_TUPLE + b"t" + BUILD, "BUILD with slot state"),
    (text("posix.system") + text("touch MARKER") + TUPLE1 + REDUCE, "REDUCE on a string"),
    (EMPTY_TUPLE + EMPTY_TUPLE + NEWOBJ, "NEWOBJ on a tuple"),
    (MARK + text("x") + OBJ, "OBJ on a string"),
    (b"\x97", "protocol 5 NEXT_BUFFER without buffers"),
    (b"\x98", "protocol 5 READONLY_BUFFER on an empty stack"),
    (text("x") + b"\x94" + b"h\x05", "memo GET of an unknown key"),
])
def test_odd_opcodes_without_a_class_are_clean_errors(opcodes, why):
    with pytest.raises(DecodeError):
        decode_dump_bytes(proto(5) + opcodes + STOP, 10**6)


@pytest.mark.parametrize("opcode", [b"\x96", b"\x8e", b"\x8d"], ids=["BYTEARRAY8", "BINBYTES8", "BINUNICODE8"])
def test_an_absurd_length_is_a_clean_error(opcode):
    # 15 bytes claiming 7e18 bytes of payload: refused, and fast.
    started = time.monotonic()
    with pytest.raises(DecodeError):
        decode_dump_bytes(proto(5) + opcode + (0x636173630000000D).to_bytes(8, "little") + b"abc" + STOP, 10**6)
    assert time.monotonic() - started < 1


def test_an_absurd_bytearray8_length_gives_one_stderr_line(tmp_path):
    directory = write_job(tmp_path / "dumps", healthy_dumps(4))
    (directory / "rank_3").write_bytes(proto(5) + b"\x96" + (0x636173630000000D).to_bytes(8, "little") + b"abc" + STOP)
    result = run_cli([directory, "--workers", "1"])
    assert result.exit_code == 3
    assert len(stderr_lines(result)) == 1, stderr_lines(result)
    assert "memory" not in result.stderr


def _address_space_limit():
    resource = pytest.importorskip("resource")
    if not os.path.exists("/proc/self/statm") or threading.active_count() > 1:
        pytest.skip("decoding is only capped on Linux, in a single-threaded process")
    return resource.getrlimit(resource.RLIMIT_AS)


@pytest.mark.parametrize("opcodes", [
    pytest.param(EMPTY_DICT + b"r" + (2**27).to_bytes(4, "little"), id="LONG_BINPUT-2**27"),
    pytest.param(EMPTY_DICT + b"r" + (2**31 - 1).to_bytes(4, "little"), id="LONG_BINPUT-2**31-1"),
    pytest.param(EMPTY_DICT + b"p99999999999\n", id="PUT-text"),
    pytest.param(b"\x96" + (2**33).to_bytes(8, "little") + b"abc", id="BYTEARRAY8-8GB"),
])
def test_memo_and_length_bombs_are_refused_at_once_and_the_limit_is_restored(opcodes):
    before = _address_space_limit()
    started = time.monotonic()
    with pytest.raises(DecodeError, match="corrupt pickle") as err:
        decode_dump_bytes(proto(5) + opcodes + STOP, 10**6)
    assert time.monotonic() - started < 1
    assert "memory" not in str(err.value)
    assert _address_space_limit() == before


def test_an_honest_dump_decodes_and_leaves_the_limit_as_it_was():
    before = _address_space_limit()
    data, encoding = decode_dump_bytes(pickle.dumps({"version": "2.10", "entries": [{"i": i} for i in range(10_000)]},
                                                    protocol=2), 10**7)
    assert encoding == "pickle" and len(data["entries"]) == 10_000
    assert _address_space_limit() == before


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_protocol_decodes_to_what_was_pickled_and_any_truncation_is_a_clean_error(protocol):
    # The unpickler reads the bytes through safe_decode._WholeInput: its read, readline
    # (text opcodes such as INT and LONG) and readinto (long bytes) paths all run here.
    dump = {"version": "2.10", "entries": [{"record_id": i, "state": "completed\n", "big": 10**40 + i,
                                            "raw": b"\x00" * 70_000 if protocol >= 3 else None} for i in range(3)]}
    data = pickle.dumps(dump, protocol=protocol)
    line_opcodes = proto(protocol) + b"I42\nL-7\n" + TUPLE1 + b"\x86" + STOP  # INT, LONG, then a pair
    assert decode_dump_bytes(data, 10**7) == (dump, "pickle")
    assert decode_dump_bytes(line_opcodes, 10**6) == ((42, (-7,)), "pickle")
    for cut in (3, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError, match="truncated or corrupt pickle"):
            decode_dump_bytes(data[:cut], 10**7)
    with pytest.raises(DecodeError, match="truncated or corrupt pickle"):
        decode_dump_bytes(proto(protocol) + b"I42", 10**6)


def test_protocol_0_and_1_pickles_are_not_even_unpickled(marker):
    # No PROTO opcode: frtrace only unpickles what starts with 0x80, like the C++ pickler writes.
    for data in (b"cposix\nsystem\n(S'" + shell(marker).encode() + b"'\ntR.", global_("helpers", "tripwire") + text(str(marker)) + TUPLE1 + REDUCE + STOP):
        with pytest.raises(DecodeError, match="not a Flight Recorder dump"):
            decode_dump_bytes(data, 10**6)


def test_a_hostile_pickle_inside_gzip_is_refused(marker):
    import gzip

    with pytest.raises(DecodeError, match="refused"):
        decode_dump_bytes(gzip.compress(payload("GLOBAL posix.system + REDUCE", marker, wrapped=True)), 10**6)


@pytest.mark.parametrize("module", [
    "posix\nfrtrace: HEALTHY: nothing to see",
    "p" * 100_000,
], ids=["newline", "100kB"])
def test_refusal_message_is_one_short_printable_line(module, tmp_path, marker):
    data = proto(4) + as_dump(stack_global(module, "system") + text(shell(marker)) + TUPLE1 + REDUCE) + STOP
    (tmp_path / "rank_0").write_bytes(data)
    result = run_cli([tmp_path, "--workers", "1"])
    assert result.exit_code == 2
    (line,) = stderr_lines(result)
    assert "rank_0" in line and len(line) < 1000


def test_a_corrupt_pickle_reason_is_one_printable_line(tmp_path):
    data = proto(2) + b"Fx\x1b]0;owned\x07\x08\n" + STOP
    issue = load_one(0, _write(tmp_path / "rank_0", data))
    assert isinstance(issue, LoadIssue)
    assert issue.problem.isprintable(), repr(issue.problem)
    directory = write_job(tmp_path / "dumps", healthy_dumps(4))
    (directory / "rank_3").write_bytes(data)
    result = run_cli([directory, "--workers", "1"])
    assert result.exit_code == 3 and len(stderr_lines(result)) == 1, stderr_lines(result)


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_load_dumps_lists_the_file_with_a_reason_and_runs_nothing(name, tmp_path, marker):
    directory = write_job(tmp_path / "dumps", {r: d for r, d in healthy_dumps(3).items() if r != 1})
    hostile = directory / "rank_1"
    hostile.write_bytes(payload(name, marker, wrapped=True))
    result = load_dumps([directory])
    assert [d.rank for d in result.dumps] == [0, 2]
    (issue,) = result.errors
    assert issue.path == str(hostile) and "refused" in issue.problem
    assert result.failed_ranks == (1,)
    assert isinstance(load_one(1, str(hostile)), LoadIssue)


def test_hostile_files_are_refused_in_worker_processes_too(tmp_path, marker):
    directory = write_job(tmp_path / "dumps", healthy_dumps(8))
    for rank, name in [(2, "GLOBAL posix.system + REDUCE"), (5, "BUILD helpers.Tripwire.__setstate__"),
                       (7, "STACK_GLOBAL subprocess.Popen + REDUCE")]:
        (directory / f"rank_{rank}").write_bytes(payload(name, marker, wrapped=True))
    result = load_dumps([directory], workers=2)
    assert result.failed_ranks == (2, 5, 7)
    assert sorted(e.path.rsplit("/", 1)[-1] for e in result.errors) == ["rank_2", "rank_5", "rank_7"]
    assert all("refused" in e.problem for e in result.errors)


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("name", sorted(PAYLOADS) + sorted(EXT_CODES))
def test_cli_only_a_hostile_file_exits_2_naming_it(name, tmp_path, marker):
    hostile = tmp_path / "rank_0"
    hostile.write_bytes(payload(name, marker, wrapped=True))
    result = run_cli([tmp_path, "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 2
    (line,) = stderr_lines(result)
    assert str(hostile) in line and line.startswith("frtrace: error:")
    assert result.stdout == ""


@pytest.mark.parametrize("name", sorted(PAYLOADS) + sorted(EXT_CODES))
def test_cli_analyses_the_other_ranks_and_names_the_hostile_file(name, tmp_path, marker):
    directory = write_job(tmp_path / "dumps", healthy_dumps(4))
    hostile = directory / "rank_3"
    hostile.write_bytes(payload(name, marker, wrapped=True))
    result = run_cli([directory, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == 3  # the other ranks are healthy; rank 3 is unknown
    (line,) = stderr_lines(result)
    assert line.startswith("frtrace: skipped ") and str(hostile) in line
    report = json.loads(result.stdout)
    assert report["status"] == "inconclusive"
    assert report["inputs"]["ranks_found"] == [0, 1, 2] and report["inputs"]["ranks_missing"] == [3]
    assert [f["path"] for f in report["inputs"]["unreadable_files"]] == [str(hostile)]


@pytest.mark.parametrize("scenario, rank", [("hang_never_arrives", 0), ("hang_never_arrives", 2), ("cascade_tp_dp", 5)])
def test_cli_a_hostile_file_counts_as_a_missing_dump_on_real_fixtures(scenario, rank, tmp_path, marker):
    missing = copy_fixture(scenario, tmp_path / "missing")
    (missing / f"rank_{rank}").unlink()
    expected = run_cli([missing, "--format", "json", "--workers", "1"])
    hostile_dir = copy_fixture(scenario, tmp_path / "hostile")
    (hostile_dir / f"rank_{rank}").write_bytes(payload("GLOBAL posix.system + REDUCE", marker, wrapped=True))
    result = run_cli([hostile_dir, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    assert result.exit_code == expected.exit_code and result.exit_code in (1, 3)
    got, want = json.loads(result.stdout), json.loads(expected.stdout)
    assert got["status"] == want["status"] and got["suspect_ranks"] == want["suspect_ranks"]
    assert [(f["kind"], f["ranks"]) for f in got["findings"]] == [(f["kind"], f["ranks"]) for f in want["findings"]]
    assert len(stderr_lines(result)) == 1 and f"rank_{rank}" in result.stderr
