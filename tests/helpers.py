"""Builders for small hand-made dumps, written the way the producers write them."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import struct
from collections import defaultdict
from pathlib import Path

FRAMES = [
    {"name": "all_reduce", "filename": "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
    {"name": "train_step", "filename": "/workspace/job/train.py", "line": 42},
]


def entry(seq: int, op: str = "all_reduce", *, record_id: int = None, pg=("0", "default_pg"), pg_id: int = 0,
          sizes=((16,),), dtype: str = "Float", state: str = "completed", backend: str = "nccl", p2p_seq: int = 0,
          time_ns: int = None, frames=FRAMES, **extra) -> dict:
    record = {
        "record_id": seq - 1 if record_id is None else record_id,
        "pg_id": pg_id,
        "process_group": tuple(pg),
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq,
        "profiling_name": f"{backend}:{op}",
        "time_created_ns": time_ns if time_ns is not None else 1_700_000_000_000_000_000 + seq * 1_000_000,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": [dtype] * len(sizes),
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": op.startswith(("send", "recv")),
        "thread_id": "1",
        "thread_name": "pt_nccl_watchdog",
        "frames": list(frames),
    }
    record.update(extra)
    return record


def list_form(record: dict, group_size: int) -> dict:
    """An `entry()` record of an all_gather (reduce_scatter) made what c10d records for a
    group of `group_size`: its one input (output) tensor, and a list of that many output
    (input) tensors of its shape; other ops are left as they are."""
    op = record["profiling_name"].partition(":")[2]
    side = {"all_gather": "output", "reduce_scatter": "input"}.get(op)
    if side is not None:
        record[f"{side}_sizes"] = record[f"{side}_sizes"][:1] * group_size
        record[f"{side}_dtypes"] = record[f"{side}_dtypes"][:1] * group_size
    return record


def dump(entries: list, *, ranks=None, version: str = "2.10") -> dict:
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(ranks)) if ranks is not None else "[]"}}
    return {"version": version, "pg_config": config, "pg_status": {}, "comm_lib_version": "2.27.5", "entries": entries}


def write_pickle(path: Path, data) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=2))
    return path


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def write_job(directory: Path, dumps_by_rank: dict, prefix: str = "rank_") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, data in dumps_by_rank.items():
        write_pickle(directory / f"{prefix}{rank}", data)
    return directory


def write_synth_job(directory: Path, job) -> Path:
    """A `frtrace.testing.synth` job as NCCL files, pickled the way torch lays them out (shared frame
    dicts), which the loader's fast paths rely on; `write_job` pickles plainly."""
    from frtrace.testing.synth import encode_dump

    directory.mkdir(parents=True, exist_ok=True)
    for rank, data in job.dumps.items():
        (directory / f"nccl_trace_rank_{rank}").write_bytes(encode_dump(data, "pickle"))
    return directory


# --------------------------------------------------------------------------- timed NCCL jobs

T0_NS = 1_700_000_000_000_000_000
MS_NS = 1_000_000


def _timed(record: dict, created_ms: float, completed_ms=None, skew_ns: int = 0) -> dict:
    """Set the times of an `entry()` record the way NCCL with timing on writes them."""
    created = T0_NS + int(created_ms * MS_NS) + skew_ns
    record["time_created_ns"] = created
    record["time_discovered_started_ns"] = created + 50_000
    if completed_ms is None:
        record.update(state="started", retired=False, duration_ms=None, time_discovered_completed_ns=None)
    else:
        completed = T0_NS + int(completed_ms * MS_NS) + skew_ns
        record.update(state="completed", retired=True, time_discovered_completed_ns=completed,
                      duration_ms=(completed - created - 50_000) / MS_NS)
    return record


def nccl_hang_dumps(world: int = 4, culprit: int = 3, skew_ns=None) -> dict:
    """rank -> dump of a timed NCCL job that hangs in all_reduce #4 of group 0.

    Every rank runs all_reduce #1-#3 in group "0" (#3 is enqueued before #2 has
    finished, so they overlap in time); ranks 0 and 1 also run an all_gather in
    group "1" (desc "tp") and a send 0->1 / recv 1<-0 pair; every rank but `culprit`
    then enqueues all_reduce #4 and waits in it. `skew_ns` maps a rank to the offset
    of its clock; a collective completes at the same true moment on every rank.
    """
    skew_ns = skew_ns or {}
    tp = ("1", "tp")
    dumps = {}
    for rank in range(world):
        skew = skew_ns.get(rank, 0)
        arrive = rank * 0.1  # ms: ranks reach each collective slightly apart
        records = [
            _timed(entry(1), 10 + arrive, 12, skew),
            _timed(entry(2), 20 + arrive, 23, skew),
            _timed(entry(3), 21 + arrive, 24, skew),
        ]
        if rank in (0, 1):
            records.append(_timed(list_form(entry(1, "all_gather", pg=tp, pg_id=1, sizes=((8,),)), 2), 26 + arrive, 27, skew))
            op = "send 0->1" if rank == 0 else "recv 1<-0"
            records.append(_timed(entry(3, op, p2p_seq=1), 30 + arrive, 31, skew))
        if rank != culprit:
            records.append(_timed(entry(4), 40 + arrive, None, skew))
        for record_id, record in enumerate(records):
            record["record_id"] = record_id
        config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
        if rank in (0, 1):
            config["1"] = {"name": "1", "desc": "tp", "ranks": "[0, 1]"}
        dumps[rank] = {"version": "2.10", "pg_config": config, "pg_status": {}, "comm_lib_version": "2.27.5",
                       "entries": records}
    return dumps


def gloo_hang_dumps(world: int = 4, culprit: int = 3) -> dict:
    """rank -> dump of a gloo job: states stay `scheduled`, only `retired` tells
    completion, no completion times; `culprit` never issues all_reduce #4."""
    dumps = {}
    for rank in range(world):
        records = [entry(seq, backend="gloo", state="scheduled", retired=True, time_ns=T0_NS + seq * 3 * MS_NS + rank * 1000)
                   for seq in (1, 2, 3)]
        if rank != culprit:
            records.append(entry(4, backend="gloo", state="scheduled", retired=False, time_ns=T0_NS + 12 * MS_NS + rank * 1000))
        dumps[rank] = dump(records, ranks=range(world))
    return dumps


# --------------------------------------------------------------------------- hardening tests

FIXTURES = Path(__file__).parent / "fixtures" / "gloo"


def fixture_dir(name: str) -> Path:
    """A real gloo fixture directory; skips the test when it is missing or empty (fixtures
    may be regenerated while tests run)."""
    import pytest

    path = FIXTURES / name
    if not path.is_dir() or not any(p.name.startswith("rank_") for p in path.iterdir()):
        pytest.skip(f"fixture {name} is not present")
    return path


def copy_fixture(name: str, dest: Path) -> Path:
    """Copy a fixture's rank files into `dest` (created) and return it."""
    src = fixture_dir(name)
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.iterdir()):
        if path.is_file():
            (dest / path.name).write_bytes(path.read_bytes())
    return dest


def healthy_dumps(world: int = 4, seqs=(1, 2, 3)) -> dict:
    """rank -> dump of a job whose every collective completed on every rank."""
    return {r: dump([entry(s) for s in seqs], ranks=range(world)) for r in range(world)}


def run_cli(args, **kwargs):
    """Run `frtrace` through click's CliRunner (stdout and stderr kept apart). A Python
    exception escaping the command is a crash: it fails the test with its traceback."""
    import traceback

    import pytest
    from click.testing import CliRunner

    from frtrace.cli.analyse import frtrace

    result = CliRunner().invoke(frtrace, [str(a) for a in args], **kwargs)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        detail = "".join(traceback.format_exception(*result.exc_info, limit=-6))
        # pytrace=False: the traceback is in the message; pytest need not re-render it (slow).
        pytest.fail(f"frtrace crashed on {args}:\n{detail}", pytrace=False)
    return result


def no_crash(function, *args, **kwargs):
    """Call `function`; an exception fails the test with the innermost frames in the message
    (cheaper for pytest to report than a full traceback, which matters for strict xfails)."""
    import traceback

    import pytest

    try:
        return function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))
        pytest.fail(f"crashed: {type(exc).__name__}\n{detail}", pytrace=False)


def assert_no_traceback(result) -> None:
    assert "Traceback" not in result.output and "Traceback" not in result.stderr, result.output
    assert "internal error" not in result.stderr, result.stderr


def stderr_lines(result) -> list:
    return [line for line in result.stderr.splitlines() if line.strip()]


class Tripwire:
    """A class a hostile pickle may try to reach (as `helpers.Tripwire`): creating it,
    calling it or setting its state touches the marker file it is given. Tests prove
    with the standard unpickler that their payloads do reach it, and that frtrace's
    loader never does."""

    def __new__(cls, marker=None, *args, **kwargs):
        if marker:
            Path(marker).touch()
        return super().__new__(cls)

    def __init__(self, marker=None, *args, **kwargs):
        if marker:
            Path(marker).touch()

    def __setstate__(self, state):
        marker = state.get("marker") if isinstance(state, dict) else None
        if marker:
            Path(marker).touch()


def tripwire(marker, *args, **kwargs):
    """A function a hostile pickle may try to call (as `helpers.tripwire`)."""
    Path(marker).touch()
    return marker


def analyse_dicts(dumps_by_rank: dict, encoding: str = "pickle", render: bool = True):
    """The whole pipeline on in-memory dump dicts, as `pipeline.analyze` runs it on files:
    normalise (a dict that is not a dump counts as an unreadable rank, as in `load_one`),
    build the layout, match, diagnose, and (by default) render every report, the raw view
    and the Database. Returns `(analysis, diagnosis)`, or None when no rank was usable."""
    from frtrace.diagnosis import diagnose
    from frtrace.load.layout import build_layout
    from frtrace.load.loader import normalise_dump
    from frtrace.load.normalise import count_collectives_apart_from_batches, settle_only_active_job
    from frtrace.load.safe_decode import DecodeError
    from frtrace.match.analysis import finish_analysis
    from frtrace.match.matcher import match
    from frtrace.model import LoadIssue
    from frtrace.table.rank_dump import LoadResult

    dumps, errors, failed = [], [], []
    for rank, raw in sorted(dumps_by_rank.items()):
        try:
            dumps.append(normalise_dump(raw, rank, f"rank_{rank}", encoding))
        except DecodeError as exc:
            errors.append(LoadIssue(f"rank_{rank}", str(exc)))
            failed.append(rank)
    if not dumps:
        return None
    dumps = count_collectives_apart_from_batches(dumps)
    settle_only_active_job(dumps)
    layout = build_layout(dumps, failed, None)
    analysis = finish_analysis(LoadResult(dumps=dumps, errors=errors, prefix="rank_", failed_ranks=tuple(failed)),
                               layout, match(dumps, layout))
    diagnosis = diagnose(analysis)
    if render:
        render_report_outputs(analysis, diagnosis)
    return analysis, diagnosis


def render_report_outputs(analysis, diagnosis) -> None:
    """Everything the CLI can print or pickle for an analysis, in memory."""
    from frtrace.export.database import build_database
    from frtrace.report.raw_view import render_raw_entries
    from frtrace.report.render import render_json, render_markdown, render_text

    render_json(analysis, diagnosis)
    render_text(analysis, diagnosis)
    render_markdown(analysis, diagnosis)
    render_raw_entries(analysis.matches, None, [], True)
    build_database(analysis.matches)


def assert_fault_kind_named(truth: dict, diagnosis) -> None:
    """A faulty job's injected kind is among the root findings that blame someone; a
    straggler's is a warning naming the slow rank, on a job that is otherwise healthy."""
    if truth["status"] == "faults":
        assert truth["fault_kind"] in {f.kind for f in diagnosis.findings if f.is_root and f.suspect_ranks}
    for rank in truth.get("warned_ranks", []):
        assert any(f.kind == truth["fault_kind"] and f.severity == "warning" and rank in f.ranks
                   for f in diagnosis.findings)

# --------------------------------------------------------------------------- small jobs for rule tests


def job(steps: dict, *, groups: dict = None, world: int = None, backend: str = "nccl", late_ms: dict = None) -> dict:
    """rank -> dump dict of a small job, written the way NCCL (timing on) or gloo writes it.

    `steps` maps each rank with a dump to the ops it issued, oldest first: `"all_reduce"`,
    `"all_gather@tp0"` (op in group `tp0`), `"send 0->1"` (group-local ranks, as torch
    names them; `"recv 1<-?"` from any source), or `(that, {"sizes": ..., "dtype": ...,
    "state": ..., "seq": ...})` to override a field; any other key of that dict is set on
    the entry as it is (`"output_sizes"`, `"input_split_sizes"` ...). `groups` maps a group name to `(desc, ranks)`; by default one group
    "0" (default_pg) spans `world` ranks (default: one more than the largest rank in `steps`).
    Sequence numbers count per rank and group. States follow from the job unless given: a
    collective completes when every member issued it alike, a send or recv when its partner
    was posted; otherwise it is `started`. A collective completes on every rank at one
    moment, after its last arrival; rank r issues its i-th op at i x 10 ms + `late_ms[r]`.
    gloo: every state is `scheduled`, `retired` tells completion, and nothing is timed.
    """
    world = world if world is not None else max(steps) + 1
    groups = groups if groups is not None else {"0": ("default_pg", tuple(range(world)))}
    pg_ids = {name: pg_id for pg_id, name in enumerate(groups)}
    late_ms = late_ms or {}
    issued = {}  # rank -> [(record, its collective or P2P channel key, the state asked for)]
    for rank, ops in steps.items():
        seq, p2p, op_id, records = defaultdict(int), defaultdict(int), defaultdict(int), []
        for index, step in enumerate(ops):
            name, fields = step if isinstance(step, tuple) else (step, {})
            op, _, group = name.partition("@")
            group = group or "0"
            op_id[group] += 1
            is_p2p = op.startswith(("send", "recv"))
            if is_p2p:
                p2p[group] += 1
            else:
                seq[group] = fields.get("seq", seq[group] + 1)
            record = entry(seq[group], op, record_id=index, pg=(group, groups[group][0]), pg_id=pg_ids[group],
                           sizes=fields.get("sizes", ((16,),)), dtype=fields.get("dtype", "Float"), backend=backend,
                           p2p_seq=p2p[group], time_ns=T0_NS + index * 10 * MS_NS + int(late_ms.get(rank, 0) * MS_NS),
                           op_id=op_id[group])
            list_form(record, len(groups[group][1]))
            record.update((k, v) for k, v in fields.items() if k not in ("sizes", "dtype", "state", "seq"))
            if is_p2p:  # keyed by channel (group, global src, global dst); -1 for `?`
                here, there = (sorted(groups[group][1])[int(r)] if r != "?" else -1 for r in re.findall(r"\d+|\?", op))
                key = ("p2p", group) + ((here, there) if op.startswith("send") else (there, here))
            else:
                key = ("coll", group, seq[group])
            records.append((record, key, fields.get("state")))
        issued[rank] = records
    _settle(issued, groups, backend)
    return {rank: _job_dump(rank, [r for r, _, _ in issued[rank]], groups, pg_ids) for rank in steps}


def gloo_job(steps: dict, *, groups: dict = None, world: int = None, timed_out: bool = False) -> dict:
    """rank -> dump dict of a small gloo job written the way torch 2.13's gloo writes it when
    the job has more than one group: one pg_config group named '' with "[]" ranks (so the
    dumps never say who is in a group, nor how large the world is), every state `scheduled`,
    `retired` the only completion signal, no comm library version. `timed_out`: every op is
    retired, as gloo retires the op a peer timed out in. Arguments as for `job`."""
    dumps = job(steps, groups=groups, world=world, backend="gloo")
    for dump in dumps.values():
        dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        dump["comm_lib_version"] = ""
        for record in dump["entries"]:
            record.update(state="scheduled", thread_name="python", duration_ms=None,
                          retired=record["retired"] or timed_out)
        for status in dump["pg_status"].values():
            status["last_completed_collective"] = status["last_enqueued_collective"] if timed_out else \
                status["last_completed_collective"]
    return dumps


def _settle(issued: dict, groups: dict, backend: str) -> None:
    """Give every record of `job` its state and completion time."""
    calls = defaultdict(list)  # collective (group, seq), or P2P channel (group, src, dst) -> records
    for rank, records in issued.items():
        for record, key, _ in records:
            calls[key].append((rank, record))
    for rank, records in issued.items():
        for record, key, state in records:
            peers = calls[key]
            if key[0] == "coll":
                alike = {(r["profiling_name"], str(r["input_sizes"]), r["input_dtypes"][0]) for _, r in peers}
                done = len(alike) == 1 and {p for p, _ in peers} >= set(groups[key[1]][1])
            else:
                sends = [r for r in peers if "send" in r[1]["profiling_name"]]
                recvs = [r for r in peers if "recv" in r[1]["profiling_name"]]
                mine = sends if "send" in record["profiling_name"] else recvs
                position = next(i for i, (_, r) in enumerate(mine) if r is record)
                done = position < min(len(sends), len(recvs))
            state = state or ("completed" if done else "started")
            if backend == "gloo":
                record.update(state="scheduled", retired=state == "completed")
            else:
                _timed(record, (record["time_created_ns"] - T0_NS) / MS_NS,
                       max(r["time_created_ns"] - T0_NS for _, r in peers) / MS_NS + 1 if state == "completed" else None)
                record["state"] = state
                if state == "scheduled":  # enqueued behind the op the rank waits in: not started
                    record["time_discovered_started_ns"] = None


def _job_dump(rank: int, records: list, groups: dict, pg_ids: dict) -> dict:
    config = {name: {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
              for name, (desc, ranks) in groups.items() if rank in ranks}
    status = {}
    for name in config:
        mine = [r for r in records if r["process_group"][0] == name and not r["is_p2p"]]
        done = [r["collective_seq_id"] for r in mine if r["state"] == "completed" or r["retired"]]
        status[str(pg_ids[name])] = {"last_enqueued_collective": max((r["collective_seq_id"] for r in mine), default=-1),
                                     "last_started_collective": -1, "last_completed_collective": max(done, default=-1)}
    return {"version": "2.10", "pg_config": config, "pg_status": status, "comm_lib_version": "2.27.5", "entries": records}
# --------------------------------------------------------------------------- hostile pickles, opcode by opcode


def pickle_text(value: str) -> bytes:
    """BINUNICODE."""
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def memo_reference_dump(references: int) -> bytes:
    """`{"version": "2.10", "entries": [e] + [e] * references}` where every further `e` is a
    2-byte memo reference (BINGET) to the one entry dict: 8 MB of opcodes, 8 KB gzip'd."""
    one_entry = pickle.dumps(entry(1), protocol=2)[2:-1]
    body = b"}(" + pickle_text("version") + pickle_text("2.10") + pickle_text("entries") + b"]" + one_entry + b"q\x01a"
    body += b"(" + b"h\x01" * references + b"e"
    return gzip.compress(b"\x80\x02" + body + b"u.")


def deep_tuple_key_dump(depth: int, via_memo: bool = False) -> bytes:
    """`{((((),),),...): "x"}`, the key nested `depth` deep: built by TUPLE1 opcodes in a row,
    or (`via_memo`) each level from a memo reference to the last, so that the unpickler's
    stack never grows. The unpickler hashes the key to set it: C recursion, per level."""
    if via_memo:
        levels = b")q\x000" + b"h\x00\x85q\x000" * depth + b"h\x00"  # get, TUPLE1, put, pop
    else:
        levels = b")" + b"\x85" * depth
    return gzip.compress(b"\x80\x02}" + levels + pickle_text("x") + b"s.")


def forks_recorded(monkeypatch) -> list:
    """Forked.start and Forked.start_each record what they were asked to run (one record
    per child) instead of forking: returns the list (empty where nothing would have forked)."""
    from frtrace.load import forked

    started: list = []
    monkeypatch.setattr(forked.Forked, "start", lambda *args: started.append(args))

    def start_each(function, shares):
        started.extend((function, share) for share in shares)
        return [None] * len(shares)

    monkeypatch.setattr(forked.Forked, "start_each", start_each)
    return started


def forks_refused(monkeypatch) -> None:
    """Forked.start and Forked.start_each fail as fork does on a system out of processes."""
    from frtrace.load import forked

    def refuse(*_):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(forked.Forked, "start", refuse)
    monkeypatch.setattr(forked.Forked, "start_each", lambda function, shares: [None] * len(shares))


def unreaped_children() -> list[int]:
    """Our children that have exited and not been waited for (zombies)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] == "Z":
            found.append(int(name))
    return found
