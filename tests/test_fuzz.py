"""Property-based fuzzing: whatever the bytes or the values, frtrace answers and never raises.

(a) real dump bytes, mutated (bit flips, byte writes, inserts, deletes, truncation,
    duplicated runs): `load_one` returns a RankDump or a LoadIssue; a job with one mutated
    rank goes through the whole pipeline.
(b) dumps whose every entry field (and top-level key) may hold any JSON-like value, or be
    missing: `normalise_dump` and the whole pipeline (`analyze`, `diagnose`, every renderer,
    the raw view and the Database) never raise.
(c) archives (zip, tar, tar.gz) of a small job with hostile members (names deep, absolute,
    with `..` or escapes, listed twice; bombs, empty and broken payloads; impossible
    times; zip entries sharing one compressed stream), then mutated: the pipeline answers
    or says why not, in one line.
(d) every output (text, markdown, JSON, HTML, the per-rank views, -j, SQLite, the
    timeline, frtrace diff) of a job whose dump strings hold any characters: none comes
    out raw when it is a control or bidi character.

Bounded for CI (a few seconds, derandomized so a run is reproducible). `tools/fuzz_long.py`
runs the same properties with many more examples. Crashes that are already reported
(KNOWN_CRASHES, each with its own strict-xfail test) are tolerated by the guard properties
so that they keep catching new ones; the `_including_known_bugs` variant tolerates nothing.
"""

from __future__ import annotations

import atexit
import gzip
import json
import math
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers import FIXTURES, analyse_dicts, render_report_outputs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from frtrace.diagnosis import diagnose
from frtrace.load.loader import load_one, normalise_dump
from frtrace.load.safe_decode import DecodeError
from frtrace.match.analysis import analyze
from frtrace.model import LoadIssue
from frtrace.report.render import render_json, render_text
from frtrace.table.rank_dump import RankDump
from frtrace.testing.synth import Fault, encode_dump, generate

CI = settings(max_examples=80, deadline=None, derandomize=True, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))

# Crashes already reported, each pinned by a strict-xfail test in test_broken_inputs.py.
# Remove a line once its bug is fixed: the guard properties then fail on it again.
KNOWN_CRASHES: tuple = ()  # none at the moment


def known_crash(exc: BaseException) -> bool:
    return any(isinstance(exc, kind) and text in str(exc) for kind, text in KNOWN_CRASHES)


def tolerate_known(check, *args):
    """Run `check`; swallow only the crashes already reported."""
    try:
        return check(*args)
    except Exception as exc:  # noqa: BLE001
        if known_crash(exc):
            return "known-crash"
        raise


# --------------------------------------------------------------------------- sources of real bytes


def _source_files() -> list:
    """(name, bytes): real gloo dumps when present, and synthetic NCCL dumps with timing, P2P,
    coalesced batches and a fault (always available)."""
    sources = []
    for scenario, rank in [("hang_never_arrives", 0), ("cascade_tp_dp", 5), ("coalesced_healthy", 1),
                           ("cascade_tp_dp_json", 2), ("uneven_alltoall_healthy_json", 0)]:
        path = FIXTURES / scenario / f"rank_{rank}"
        if path.is_file():
            sources.append((f"{scenario}/rank_{rank}", path.read_bytes()))
    job = generate(4, 2, 1, steps=2, timing=True, lookahead=1, fault=Fault("hang", rank=1, group="tp", step=1))
    sources.append(("synth/pickle", encode_dump(job.dumps[0], "pickle")))
    sources.append(("synth/json", encode_dump(job.dumps[2], "json")))
    sources.append(("synth/pickle.gz", gzip.compress(encode_dump(job.dumps[3], "pickle"))))
    return sources


SOURCES = _source_files()
SCRATCH = Path(tempfile.mkdtemp(prefix="frtrace-fuzz-"))  # files for load_one / analyze, rewritten per input
atexit.register(shutil.rmtree, SCRATCH, True)


mutation = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "duplicate"]),
                     st.integers(min_value=0, max_value=2**31), st.integers(min_value=0, max_value=255),
                     st.integers(min_value=1, max_value=64))
mutations = st.lists(mutation, min_size=1, max_size=6)


def mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for kind, position, value, length in edits:
        if not out:
            out = bytearray([value])
            continue
        at = position % len(out)
        if kind == "flip":
            out[at] ^= 1 << (value % 8)
        elif kind == "set":
            out[at] = value
        elif kind == "insert":
            out[at:at] = bytes([value]) * length
        elif kind == "delete":
            del out[at:at + length]
        elif kind == "truncate":
            del out[at:]
        else:
            out[at:at] = out[at:at + length]
    return bytes(out)


def check_load_one(source: int, edits) -> str:
    name, original = SOURCES[source % len(SOURCES)]
    path = SCRATCH / "rank_0"
    path.write_bytes(mutate(original, edits))
    result = load_one(0, str(path))
    assert isinstance(result, (RankDump, LoadIssue)), type(result)
    if isinstance(result, LoadIssue):
        assert result.path == str(path) and result.problem
        # Reported (strict xfail in test_hostile_pickles): some reasons quote raw file bytes.
        return "LoadIssue" if result.problem.isprintable() else "LoadIssue (unprintable reason)"
    return "RankDump"


# Two small real-looking jobs (one healthy, one with an unmatched send): one rank's file gets
# mutated, then the whole pipeline runs.
_JOBS = {
    "healthy": generate(4, 2, 2, steps=2, timing=True, lookahead=1),
    "p2p_unmatched": generate(4, 1, 2, steps=2, timing=True, fault=Fault("p2p_unmatched", rank=2, group="pp", step=1)),
}
JOB_FILES = {kind: {rank: {fmt: encode_dump(job.dumps[rank], fmt) for fmt in ("pickle", "json")} for rank in job.dumps}
             for kind, job in _JOBS.items()}


def check_pipeline_with_a_mutated_rank(rank: int, edits, as_json: bool, healthy: bool = False) -> str:
    directory = SCRATCH / "job"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    files = JOB_FILES["healthy" if healthy else "p2p_unmatched"]
    victim = rank % len(files)
    for r, encoded in files.items():
        data = encoded["json" if as_json and r == victim else "pickle"]
        (directory / f"nccl_trace_rank_{r}").write_bytes(mutate(data, edits) if r == victim else data)
    analysis = analyze([directory])
    diagnosis = diagnose(analysis)
    render_report_outputs(analysis, diagnosis)
    json.loads(render_json(analysis, diagnosis))
    return diagnosis.status


@CI
@given(source=st.integers(min_value=0, max_value=len(SOURCES) - 1), edits=mutations)
def test_fuzz_mutated_dump_bytes_never_crash_load_one(source, edits):
    tolerate_known(check_load_one, source, edits)


@settings(CI, max_examples=40)
@given(rank=st.integers(min_value=0, max_value=3), edits=mutations, as_json=st.booleans(), healthy=st.booleans())
def test_fuzz_a_mutated_rank_never_crashes_the_pipeline(rank, edits, as_json, healthy):
    tolerate_known(check_pipeline_with_a_mutated_rank, rank, edits, as_json, healthy)


# --------------------------------------------------------------------------- generated dumps

MISSING = "<missing>"  # a sentinel that survives pickling: the key is dropped
ENTRY_FIELDS = ("record_id", "pg_id", "process_group", "collective_seq_id", "seq_id", "p2p_seq_id", "op_id",
                "profiling_name", "time_created_ns", "duration_ms", "input_sizes", "output_sizes", "input_dtypes",
                "output_dtypes", "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired",
                "timeout_ms", "is_p2p", "thread_id", "thread_name", "frames")

# Values the guard properties use: scalars that do not hit KNOWN_CRASHES' triggers (no
# containers where a string is interned, no 4300-digit ints, no '²'-like digits).
safe_text = st.text(alphabet=st.characters(blacklist_categories=("No", "Cs")), max_size=12)
safe_ints = st.integers(min_value=-2**63, max_value=2**63)
safe_scalars = st.one_of(st.none(), st.booleans(), safe_ints, st.floats(), safe_text)
# Anything JSON-like (and a few pickle-only values) for the full properties.
any_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                        st.binary(max_size=8), st.sampled_from(["\u00b2", "\udcff", -(2**80), 2**63, 2**64 - 1, -(2**63) - 1]),
                        st.just(5000).map(lambda digits: 10**digits))  # built lazily: its repr() would raise
any_values = st.recursive(any_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=6), inner, max_size=3), max_leaves=8)

OPS = ["all_reduce", "broadcast", "all_gather", "_allgather_base", "reduce_scatter", "all_to_all", "barrier",
       "send 0->1", "recv 1<-0", "send 1->0", "recv 0<-1", "recv 0<-?", "send 3->-1", "coalesced",
       "ALLGATHER_coalesced", "allreduce_coalesced", "", "unknown_op"]
plausible = {
    "record_id": st.integers(min_value=-1, max_value=12),
    "pg_id": st.integers(min_value=-1, max_value=3),
    "process_group": st.tuples(st.sampled_from(["0", "1", "", "tp", "\u0661"]), st.sampled_from(["default_pg", "tp", "dp", ""])),
    "collective_seq_id": st.integers(min_value=-1, max_value=6),
    "seq_id": st.integers(min_value=0, max_value=6),
    "p2p_seq_id": st.integers(min_value=0, max_value=4),
    "op_id": st.integers(min_value=0, max_value=8),
    "profiling_name": st.builds(lambda b, op: f"{b}:{op}" if b else op,
                                st.sampled_from(["nccl", "gloo", "xccl", ""]), st.sampled_from(OPS)),
    "time_created_ns": st.integers(min_value=0, max_value=2 * 10**18),
    "duration_ms": st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
    "input_sizes": st.lists(st.lists(st.integers(min_value=0, max_value=64), max_size=3), max_size=3),
    "output_sizes": st.lists(st.lists(st.integers(min_value=0, max_value=64), max_size=3), max_size=3),
    "input_dtypes": st.lists(st.sampled_from(["Float", "BFloat16", "Int"]), max_size=3),
    "output_dtypes": st.lists(st.sampled_from(["Float", "BFloat16", "Int"]), max_size=3),
    "state": st.sampled_from(["scheduled", "started", "completed", "odd"]),
    "time_discovered_started_ns": st.one_of(st.none(), st.just(0), st.integers(min_value=0, max_value=2 * 10**18)),
    "time_discovered_completed_ns": st.one_of(st.none(), st.just(0), st.integers(min_value=0, max_value=2 * 10**18)),
    "retired": st.booleans(),
    "timeout_ms": st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
    "is_p2p": st.booleans(),
    "thread_id": st.text(max_size=4),
    "thread_name": st.text(max_size=4),
    "frames": st.lists(st.fixed_dictionaries({"name": safe_text, "filename": safe_text,
                                              "line": st.integers(min_value=-1, max_value=10**6)}), max_size=3),
}


def _entries(odd_values):
    def field(name):
        return st.one_of(plausible[name], plausible[name], plausible[name], odd_values, st.just(MISSING))
    return st.fixed_dictionaries({name: field(name) for name in ENTRY_FIELDS})


def _dump(odd_values):
    pg_config = st.one_of(
        st.builds(lambda ranks: {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
                  st.sampled_from(["[]", "[0, 1, 2, 3]", "[0, 1]", "[1, 3]", "[-1, 2]", "oops"])),
        odd_values, st.just(MISSING))
    top = st.fixed_dictionaries({
        "version": st.one_of(st.sampled_from(["2.0", "2.4", "2.10", "2.11"]), odd_values, st.just(MISSING)),
        "pg_config": pg_config,
        "pg_status": st.one_of(st.just({"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                                               "last_completed_collective": 2}}), odd_values, st.just(MISSING)),
        "comm_lib_version": st.one_of(st.just("2.27.5"), odd_values, st.just(MISSING)),
        "entries": st.one_of(st.lists(_entries(odd_values), max_size=6), odd_values, st.just(MISSING)),
    })
    return st.one_of(top, top, top, top, st.lists(_entries(odd_values), max_size=4), odd_values)


def _jobs(odd_values):
    return st.dictionaries(st.integers(min_value=0, max_value=4), _dump(odd_values), min_size=1, max_size=4)


def _drop_missing(value):
    if isinstance(value, dict):
        return {k: _drop_missing(v) for k, v in value.items() if v != MISSING}
    if isinstance(value, list):
        return [_drop_missing(v) for v in value if v != MISSING]
    return value


def check_generated_job(job: dict, encoding: str) -> str:
    """normalise_dump on every rank, then the whole pipeline on the usable ones; then the
    same job from files through `analyze`."""
    job = {rank: _drop_missing(d) for rank, d in job.items()}
    for rank, raw in job.items():
        try:
            normalise_dump(raw, rank, f"rank_{rank}", encoding)
        except DecodeError:
            pass
    outcome = analyse_dicts(job, encoding)
    status = "unusable" if outcome is None else outcome[1].status
    directory = SCRATCH / "generated"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for rank, raw in job.items():
        if encoding == "json":
            try:
                data = json.dumps(raw).encode("utf-8", "surrogatepass")
            except (TypeError, ValueError):  # bytes, non-str keys, giant ints: not JSON
                data = pickle.dumps(raw, protocol=2)
        else:
            data = pickle.dumps(raw, protocol=2)
        (directory / f"rank_{rank}").write_bytes(data)
    try:
        analysis = analyze([directory])
    except Exception as exc:  # noqa: BLE001 - only InputError (nothing usable) is an answer
        from frtrace.load.loader import InputError
        if isinstance(exc, InputError):
            return status
        raise
    diagnosis = diagnose(analysis)
    report = json.loads(render_json(analysis, diagnosis))
    assert report["status"] == diagnosis.status
    render_text(analysis, diagnosis)
    return status


@settings(CI, max_examples=50)
@given(job=_jobs(safe_scalars), encoding=st.sampled_from(["pickle", "json"]))
def test_fuzz_generated_dumps_never_crash_the_pipeline(job, encoding):
    tolerate_known(check_generated_job, job, encoding)


# --------------------------------------------------------------------------- strict: nothing tolerated

_UNHASHABLE_JOB = {0: {"version": "2.10", "entries": [{"profiling_name": ["x"], "collective_seq_id": 1}]}}


@settings(CI, max_examples=60)
@example(job=_UNHASHABLE_JOB, encoding="pickle")
@given(job=_jobs(any_values), encoding=st.sampled_from(["pickle", "json"]))
def test_fuzz_any_values_never_crash_the_pipeline_including_known_bugs(job, encoding):
    check_generated_job(job, encoding)


@settings(CI, max_examples=50)
@given(job=_jobs(any_values), encoding=st.sampled_from(["pickle", "json"]))
def test_fuzz_any_values_crash_only_in_known_ways(job, encoding):
    tolerate_known(check_generated_job, job, encoding)


def test_mutate_is_a_real_mutation():
    data = bytes(range(50))
    assert mutate(data, [("flip", 3, 0, 1)]) != data
    assert mutate(data, [("truncate", 10, 0, 1)]) == data[:10]
    assert len(mutate(data, [("insert", 0, 7, 5)])) == 55 and len(mutate(data, [("delete", 0, 0, 5)])) == 45
    assert mutate(b"", [("set", 0, 9, 1)]) == b"\t"
    assert math.isfinite(len(SOURCES)) and len(SOURCES) >= 3


# --------------------------------------------------------------------------- hostile shapes (issue 16)

# Shapes an attack campaign found next to a healthy job: tuples nested deep (by opcodes, or
# each level a memo reference to the last), one entry named by memo references over and
# over, many entries under one sequence number, a pg_config listing a huge world, and
# integers at the edges of 64 bits. Sizes reach what crashed or stalled frtrace before.
EDGE_INTEGERS = [2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1, -(2**63), -(2**63) - 1, -(2**64) + 1]
EDGE_FIELDS = ["record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns", "timeout_ms",
               "time_discovered_started_ns", "time_discovered_completed_ns", "frames.line", "pg_id"]
hostile_shapes = st.one_of(
    st.tuples(st.just("deep_tuple"), st.sampled_from([10, 5_000, 40_000, 300_000]), st.booleans()),
    st.tuples(st.just("memo_refs"), st.sampled_from([1, 1_000, 600_000]), st.just(None)),
    st.tuples(st.just("shared_seq"), st.sampled_from([2, 3_000]), st.sampled_from([1, -1, 2**63 - 1])),
    st.tuples(st.just("huge_ranks"), st.sampled_from([4, 5_000, 100_000]), st.booleans()),
    st.tuples(st.just("edge_integers"), st.sampled_from(EDGE_INTEGERS), st.sampled_from(EDGE_FIELDS)),
)


def _hostile_rank(kind: str, size: int, option) -> bytes:
    from helpers import deep_tuple_key_dump, dump, entry, memo_reference_dump

    if kind == "deep_tuple":
        return deep_tuple_key_dump(size, via_memo=option)
    if kind == "memo_refs":
        return memo_reference_dump(size)
    if kind == "shared_seq":
        return pickle.dumps(dump([entry(option, record_id=i, frames=[]) for i in range(size)], ranks=range(3)), protocol=2)
    if kind == "huge_ranks":
        data = dump([entry(seq) for seq in (1, 2, 3)], ranks=range(size))
        return json.dumps(data).encode() if option else pickle.dumps(data, protocol=2)
    records = [entry(seq) for seq in (1, 2, 3)]  # edge_integers: `option` names the field
    for record in records:
        if option == "frames.line":
            record["frames"] = [dict(frame, line=size) for frame in record["frames"]]
        else:
            record[option] = size
    return pickle.dumps(dump(records, ranks=range(3)), protocol=2)


def check_hostile_shape(kind: str, size: int, option) -> str:
    """A healthy 2-rank job plus a hostile rank_2: the analysis, every report, the SQLite
    export and the timeline come out; rank_2 is analysed or named as unreadable."""
    from helpers import healthy_dumps, write_job

    from frtrace.export.sqlite import write_sqlite
    from frtrace.export.timeline import write_timeline

    directory = SCRATCH / "hostile"
    shutil.rmtree(directory, ignore_errors=True)
    write_job(directory, healthy_dumps(3, seqs=(1, 2, 3)) | {2: None})
    (directory / "rank_2").write_bytes(_hostile_rank(kind, size, option))
    analysis = analyze([directory])
    diagnosis = diagnose(analysis)
    render_report_outputs(analysis, diagnosis)
    report = json.loads(render_json(analysis, diagnosis))
    assert report["inputs"]["world_size"] <= 3 or kind == "huge_ranks" and size <= 5_000
    assert {0, 1} <= set(report["inputs"]["ranks_found"])
    for name in ("db.sqlite", "trace.json"):
        (SCRATCH / name).unlink(missing_ok=True)
    write_sqlite(str(SCRATCH / "db.sqlite"), analysis, diagnosis)
    write_timeline(str(SCRATCH / "trace.json"), analysis, diagnosis)
    return f"{kind}: {diagnosis.status}" + (" (rank_2 unreadable)" if analysis.load.errors else "")


@settings(CI, max_examples=25)
@given(shape=hostile_shapes)
def test_fuzz_hostile_shapes_next_to_a_healthy_job(shape):
    check_hostile_shape(*shape)


# --------------------------------------------------------------------------- archives (issue 26)

import io  # noqa: E402
import tarfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402

from frtrace.load.loader import InputError  # noqa: E402

_NOW = time.time()
_plain_names = st.sampled_from([f"rank_{r}" for r in range(4)])
member_names = st.one_of(
    _plain_names, _plain_names, _plain_names,
    st.builds(lambda depth, r: "/".join(["d" * 40] * depth) + f"/rank_{r}", st.integers(1, 8), st.integers(0, 3)),
    st.sampled_from(["../rank_1", "/abs/rank_2", "C:/rank_3", "a\x1b[2J\u202e/rank_0", "dir/", "rank_0.1",
                     "job//rank_2", "./rank_3", "notes.txt", "rank_9\x00"]),
    st.text(max_size=24),
)
member_payloads = st.sampled_from(["honest", "honest_gz", "empty", "broken", "bomb_gz", "zeros"])
member_times = st.sampled_from([0.0, _NOW - 60, _NOW - 3600, _NOW + 3600, -1e300, float("inf"), float("nan")])
archive_members = st.lists(st.tuples(member_names, member_payloads, member_times, st.integers(0, 3)),
                           min_size=1, max_size=8)


def _payload(kind: str, rank: int) -> bytes:
    honest = JOB_FILES["healthy"][rank % len(JOB_FILES["healthy"])]["pickle"]
    return {"honest": honest, "honest_gz": gzip.compress(honest), "empty": b"", "broken": b"\x80\x02 broken",
            "bomb_gz": gzip.compress(bytes(2 * 1024**2)), "zeros": bytes(4096)}[kind]


def build_archive(kind: str, members: list, overlap: bool) -> bytes:
    """A zip, tar or tar.gz of `members` ((name, payload kind, mtime, rank)); `overlap`
    points every zip entry after the first at the first one's bytes."""
    out = io.BytesIO()
    if kind == "zip":
        with warnings.catch_warnings(), zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            warnings.simplefilter("ignore")  # names listed twice: that is the point
            for name, payload, mtime, rank in members:
                stamp = time.gmtime(min(max(mtime, 315_532_800), 4_000_000_000) if math.isfinite(mtime) else 0)
                info = zipfile.ZipInfo(name or "unnamed", date_time=(max(1980, stamp[0]),) + tuple(stamp[1:6]))
                info.compress_type = zipfile.ZIP_DEFLATED
                try:
                    archive.writestr(info, _payload(payload, rank))
                except (ValueError, UnicodeEncodeError):  # a name zipfile itself refuses
                    continue
            if overlap:
                first = archive.infolist()[0].header_offset if archive.infolist() else 0
                for info in archive.infolist():
                    info.header_offset = first
        return out.getvalue()
    with tarfile.open(fileobj=out, mode="w:gz" if kind == "tgz" else "w", format=tarfile.PAX_FORMAT) as archive:
        for name, payload, mtime, rank in members:
            data = _payload(payload, rank)
            info = tarfile.TarInfo(name or "unnamed")
            info.size, info.pax_headers = len(data), {"mtime": repr(mtime)}
            try:
                archive.addfile(info, io.BytesIO(data))
            except (ValueError, UnicodeEncodeError):
                continue
    return out.getvalue()


def check_archive(kind: str, members: list, overlap: bool, edits) -> str:
    """A hostile archive, perhaps mutated: analysed (every report rendered), or refused with
    InputError; never an exception of any other kind."""
    path = SCRATCH / f"job.{'tar.gz' if kind == 'tgz' else kind}"
    path.write_bytes(mutate(build_archive(kind, members, overlap), edits) if edits else
                     build_archive(kind, members, overlap))
    try:
        analysis = analyze([path])
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc)
        return "InputError"
    if not analysis.layout.ranks_found:
        return "nothing usable"
    diagnosis = diagnose(analysis)
    render_report_outputs(analysis, diagnosis)
    json.loads(render_json(analysis, diagnosis))
    return diagnosis.status


@settings(CI, max_examples=30)
@given(kind=st.sampled_from(["zip", "tar", "tgz"]), members=archive_members, overlap=st.booleans(),
       edits=st.one_of(st.just([]), st.just([]), mutations))
def test_fuzz_hostile_archives_never_crash_the_pipeline(kind, members, overlap, edits):
    check_archive(kind, members, overlap, edits)


# --------------------------------------------------------------------------- every output escaped (issue 26)

# Text with what a terminal, a browser or a ticket must never get raw: controls, bidi marks.
hostile_text = st.text(alphabet=st.one_of(st.characters(max_codepoint=0x9F), st.sampled_from(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069|*`<>&[]\\")),
    min_size=1, max_size=16)


def check_outputs_escaped(texts: list) -> str:
    """A 4-rank hang whose version, library, group descriptions, op names, dtypes and stack
    frames carry `texts`: no output holds a raw control or bidi character."""
    from helpers import nccl_hang_dumps
    from test_hostile_outputs import assert_clean

    from frtrace.export.sqlite import write_sqlite
    from frtrace.export.timeline import write_timeline
    from frtrace.report.diff_render import render_diff_json, render_diff_markdown, render_diff_text
    from frtrace.report.html import render_html
    from frtrace.report.progress_diff import diff_progress
    from frtrace.report.raw_view import rank_block_lines, side_by_side_lines
    from frtrace.report.render import RANK_VIEW_RENDERERS, render_markdown

    text = (texts * 7)[:7]
    dumps = nccl_hang_dumps(world=4, culprit=3)
    for data in dumps.values():
        data["version"], data["comm_lib_version"] = "2.10" + text[0], text[1]
        for config in data["pg_config"].values():
            config["desc"] += text[2]
        for record in data["entries"]:
            record["process_group"] = (record["process_group"][0], record["process_group"][1] + text[2])
            if " " not in record["profiling_name"]:
                record["profiling_name"] += text[3]
            record["input_dtypes"] = record["output_dtypes"] = [text[4]]
            record["frames"] = [{"name": text[5], "filename": text[6], "line": 1}]
    analysis, diagnosis = analyse_dicts(dumps, render=False)
    outputs = {"text": render_text(analysis, diagnosis), "markdown": render_markdown(analysis, diagnosis),
               "json": render_json(analysis, diagnosis), "html": render_html(analysis, diagnosis),
               "-j": "\n".join(side_by_side_lines(analysis.matches, None, (), True))}
    outputs.update({f"--ranks {fmt}": render(analysis, diagnosis) for fmt, render in RANK_VIEW_RENDERERS.items()})
    outputs["-j --per-rank"] = "\n".join(line for d in analysis.load.dumps for line in rank_block_lines(d.rank, d))
    diff = diff_progress(analysis, analysis)
    outputs.update({"diff text": render_diff_text(diff), "diff markdown": render_diff_markdown(diff),
                    "diff json": render_diff_json(diff)})
    for name in ("db.sqlite", "trace.json"):
        (SCRATCH / name).unlink(missing_ok=True)
    write_sqlite(str(SCRATCH / "db.sqlite"), analysis, diagnosis)
    write_timeline(str(SCRATCH / "trace.json"), analysis, diagnosis)
    outputs["timeline"] = (SCRATCH / "trace.json").read_text("utf-8", "surrogateescape")
    from test_hostile_outputs import _sqlite_text
    outputs["sqlite"] = _sqlite_text(SCRATCH / "db.sqlite")
    for name, output in outputs.items():
        assert_clean(name, output)
    return diagnosis.status


@settings(CI, max_examples=25)
@given(texts=st.lists(hostile_text, min_size=1, max_size=7))
def test_fuzz_every_output_escapes_dump_strings(texts):
    check_outputs_escaped(texts)
