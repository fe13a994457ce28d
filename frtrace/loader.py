"""Find dump files, read them safely and normalise them.

Takes directories and/or files; returns a `LoadResult` with one `RankDump` per rank
(sorted by rank), the unrelated files that were skipped and the dump files that could
not be used. Every dump version (2.0 … 2.11) and backend is folded into one compact
`Entry` record; odd or missing fields become warnings, never exceptions. Nothing here
prints: the caller decides what to say.
"""

from __future__ import annotations

import ast
import operator
import os
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from .model import Entry, Frame, LoadIssue, LoadResult, OpName, PgConfig, PgStatus, RankDump, Shapes
from .safe_decode import DecodeError, decode_dump_bytes

DEFAULT_MAX_FILE_BYTES = 2 * 1024**3
# Suffixes a dump file may carry after its rank number, stripped right to left.
DUMP_SUFFIXES = (".gz", ".pkl", ".pickle", ".json", ".bin", ".dump", ".trace")
# Words that mark a naming family as Flight Recorder dumps rather than, say, core files.
DUMP_NAME_HINTS = ("rank", "trace", "dump", "fr_", "nccl", "comm")
_FRAME_FIELDS = operator.itemgetter("name", "filename", "line")
_TRAILING_RANK = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_P2P_NAME = re.compile(r"^(?P<op>send|recv)\s+(?P<a>-?\d+|\?)\s*(?P<arrow>->|<-)\s*(?P<b>-?\d+|\?)$")


class InputError(Exception):
    """The inputs as a whole cannot be analysed (message is one line for the user)."""


# --------------------------------------------------------------------------- discovery


class _Candidate:
    __slots__ = ("path", "prefix", "rank")

    def __init__(self, path: Path, prefix: str, rank: int):
        self.path, self.prefix, self.rank = path, prefix, rank


def _strip_suffixes(name: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for suffix in DUMP_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name


def parse_rank_from_name(name: str, prefix: Optional[str] = None) -> Optional[tuple]:
    """`("nccl_trace_rank_node02_", 5)` for `nccl_trace_rank_node02_5.pkl`, or None."""
    if prefix is not None and not name.startswith(prefix):
        return None
    match = _TRAILING_RANK.match(_strip_suffixes(name))
    if not match or (prefix is not None and len(match["prefix"]) < len(prefix)):
        return None
    return match["prefix"], int(match["rank"])


def _naming_family(prefix: str) -> str:
    # Host-qualified names (`node02_`, `host0.pci3_rank_`) differ per host only in digits.
    return re.sub(r"\d+", "#", prefix)


def _walk_files(root: Path) -> Iterable[Path]:
    # os.walk does not follow directory symlinks, so symlink loops cannot trap it.
    for dirpath, dirnames, filenames in os.walk(root, onerror=None):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if not filename.startswith("."):
                yield Path(dirpath) / filename


def _expand_inputs(inputs: Sequence[Path], issues: list) -> list:
    files = []
    for item in inputs:
        if item.is_dir():
            files.extend(_walk_files(item))
        elif item.is_file():
            files.append(item)
        elif item.exists():
            issues.append(LoadIssue(str(item), "not a regular file or directory"))
        else:
            raise InputError(f"{item}: no such file or directory")
    return files


def _pick_family(candidates: list) -> str:
    counts = Counter(_naming_family(c.prefix) for c in candidates)

    def score(family: str) -> tuple:
        hinted = any(hint in family.lower() for hint in DUMP_NAME_HINTS)
        return (hinted, counts[family], family)

    return max(counts, key=score)


def find_dump_files(inputs: Sequence[Path], prefix: Optional[str] = None) -> tuple:
    """Return `(files, skipped, prefix_used)`: files is a sorted list of (rank, path).

    Without `prefix`, the naming family most files share wins (digits inside host
    names are treated alike); other files are skipped with a reason.
    """
    skipped: list = []
    candidates = []
    for path in _expand_inputs(inputs, skipped):
        parsed = parse_rank_from_name(path.name, prefix)
        if parsed is None:
            reason = "no rank number in the file name" if prefix is None else f"name does not start with {prefix!r}"
            skipped.append(LoadIssue(str(path), reason))
        else:
            candidates.append(_Candidate(path, parsed[0], parsed[1]))
    if not candidates:
        return [], skipped, prefix or ""
    family = _naming_family(prefix) if prefix is not None else _pick_family(candidates)
    by_rank: dict = {}
    for cand in candidates:
        if prefix is None and _naming_family(cand.prefix) != family:
            skipped.append(LoadIssue(str(cand.path), f"name does not follow the dump naming {family.replace('#', 'N')}<rank>"))
            continue
        if cand.rank in by_rank:
            other = by_rank[cand.rank]
            raise InputError(
                f"rank {cand.rank} has two dump files: {other} and {cand.path} "
                "(pass one directory, or choose with --prefix)"
            )
        by_rank[cand.rank] = cand.path
    return sorted(by_rank.items()), skipped, family.replace("#", "N")


# --------------------------------------------------------------------------- normalising


class _Normaliser:
    """Per-file interning tables and the warnings collected while normalising."""

    def __init__(self) -> None:
        self.strings: dict = {}
        self.names: dict = {}
        self.shapes: dict = {}
        self.frames: dict = {}
        self.stacks: dict = {}
        self.warnings: Counter = Counter()

    def warn(self, message: str) -> None:
        self.warnings[message] += 1

    def text(self, value, field_name: str, default: str = "") -> str:
        if value is None:
            return default
        if not isinstance(value, str):
            self.warn(f"{field_name} is not a string")
            value = str(value)
        return self.strings.setdefault(value, value)

    def integer(self, value, field_name: str, default: Optional[int] = 0) -> Optional[int]:
        if isinstance(value, bool) or not isinstance(value, int):
            if value is None:
                return default
            if isinstance(value, str) and value.lstrip("-").isdigit():
                return int(value)
            if isinstance(value, float) and value.is_integer():
                return int(value)
            self.warn(f"{field_name} is not an integer")
            return default
        return value

    def op_name(self, profiling_name, is_p2p_flag) -> OpName:
        key = (profiling_name, bool(is_p2p_flag))
        cached = self.names.get(key)
        if cached is None:
            cached = self.names[key] = parse_profiling_name(self.text(profiling_name, "profiling_name"), bool(is_p2p_flag))
        return cached

    def sizes(self, value, field_name: str) -> tuple:
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(
            isinstance(shape, (list, tuple)) and all(type(d) is int for d in shape) for shape in value
        ):
            return tuple(map(tuple, value))
        self.warn(f"{field_name} is not a list of shapes")
        return ()

    def dtypes(self, value, field_name: str) -> tuple:
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(isinstance(d, str) for d in value):
            return tuple(value)
        self.warn(f"{field_name} is not a list of dtype names")
        return ()

    def shape_record(self, raw: dict) -> Shapes:
        # Hot path: most entries repeat a handful of shapes, so look the raw values up
        # first and validate only what is new.
        try:
            key = (
                tuple(map(tuple, raw.get("input_sizes") or ())),
                tuple(raw.get("input_dtypes") or ()),
                tuple(map(tuple, raw.get("output_sizes") or ())),
                tuple(raw.get("output_dtypes") or ()),
            )
            cached = self.shapes.get(key)
        except TypeError:  # not iterable, or unhashable inside: validate the slow way
            key, cached = None, None
        if cached is not None:
            return cached
        shapes = self._validated_shapes(raw)
        shapes = self.shapes.setdefault(shapes, shapes)
        if key is not None:
            self.shapes[key] = shapes
        return shapes

    def _validated_shapes(self, raw: dict) -> Shapes:
        return Shapes(
            self.sizes(raw.get("input_sizes"), "input_sizes"),
            self.dtypes(raw.get("input_dtypes"), "input_dtypes"),
            self.sizes(raw.get("output_sizes"), "output_sizes"),
            self.dtypes(raw.get("output_dtypes"), "output_dtypes"),
        )

    def stack(self, value) -> tuple:
        if not value:
            return ()
        try:  # hot path: a stack seen before, looked up by its raw (name, file, line)s
            key = tuple(map(_FRAME_FIELDS, value))
            cached = self.stacks.get(key)
        except (TypeError, KeyError):
            key, cached = None, None
        if cached is not None:
            return cached
        stack = self._validated_stack(value)
        if key is not None:
            self.stacks[key] = stack
        return stack

    def _validated_stack(self, value) -> tuple:
        if not isinstance(value, (list, tuple)):
            self.warn("frames is not a list")
            return ()
        frames = []
        for raw in value:
            if not isinstance(raw, dict):
                self.warn("a stack frame is not a dict")
                continue
            key = (raw.get("name"), raw.get("filename"), raw.get("line"))
            frame = self.frames.get(key)
            if frame is None:
                frame = Frame(
                    self.text(key[0], "frame name", "?"),
                    self.text(key[1], "frame filename", "?"),
                    self.integer(key[2], "frame line", 0),
                )
                self.frames[key] = frame
            frames.append(frame)
        stack = tuple(frames)
        return self.stacks.setdefault(stack, stack)


def parse_profiling_name(profiling_name: str, is_p2p_flag: bool = False) -> OpName:
    """Split `nccl:recv 1<-0` into backend, op and group-local peers."""
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        backend, rest = "", profiling_name
    rest = rest.strip()
    match = _P2P_NAME.match(rest)
    if match:
        left = -1 if match["a"] == "?" else int(match["a"])
        right = -1 if match["b"] == "?" else int(match["b"])
        src, dst = (left, right) if match["arrow"] == "->" else (right, left)
        return OpName(profiling_name, backend, match["op"], True, src, dst)
    op = rest.split(" ", 1)[0] if rest else "unknown"
    marker = op == "coalesced" or (op.endswith("_coalesced") and op[: -len("_coalesced")].isupper())
    return OpName(profiling_name, backend, op, is_p2p_flag or op in ("send", "recv"), None, None, marker)


def _process_group(raw: dict, norm: _Normaliser) -> tuple:
    pg = raw.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) >= 1:
        name = norm.text(pg[0], "process_group name")
        desc = norm.text(pg[1], "process_group desc") if len(pg) > 1 else ""
        return name, desc
    if pg is not None:
        norm.warn("process_group is not a (name, desc) pair")
    # Old dumps without process_group: the rank-local pg_id is the only handle left.
    pg_id = raw.get("pg_id")
    return norm.text(str(pg_id) if pg_id is not None else "?", "pg_id"), ""


def _optional_time(value, norm: _Normaliser, field_name: str) -> Optional[int]:
    # JSON writes 0 where pickle writes None: both mean "not observed".
    number = norm.integer(value, field_name, None)
    return number or None


def _normalise_entry(index: int, raw, norm: _Normaliser) -> Optional[Entry]:
    if not isinstance(raw, dict):
        norm.warn("an entry is not a dict (skipped)")
        return None
    get = raw.get
    integer = norm.integer
    pg_name, pg_desc = _process_group(raw, norm)
    seq = get("collective_seq_id")
    if seq is None:
        seq = get("seq_id")  # dumps before the collective/p2p split
    # `type(x) is int` skips the validating call for the values real dumps hold.
    record_id, pg_id, p2p_seq, op_id, created = get("record_id"), get("pg_id"), get("p2p_seq_id"), get("op_id"), get("time_created_ns")
    timeout, state, retired, duration = get("timeout_ms"), get("state"), get("retired"), get("duration_ms")
    started, completed = get("time_discovered_started_ns"), get("time_discovered_completed_ns")
    return Entry(
        index,
        record_id if type(record_id) is int else integer(record_id, "record_id", index),
        pg_name,
        pg_desc,
        pg_id if type(pg_id) is int else integer(pg_id, "pg_id", -1),
        seq if type(seq) is int else integer(seq, "collective_seq_id", 0),
        p2p_seq if type(p2p_seq) is int else integer(p2p_seq, "p2p_seq_id", 0),
        op_id if type(op_id) is int else integer(op_id, "op_id", 0),
        norm.op_name(get("profiling_name", "unknown"), get("is_p2p")),
        norm.shape_record(raw),
        norm.strings.get(state) or norm.text(state, "state", "scheduled"),
        retired if type(retired) is bool else None,
        created if type(created) is int else integer(created, "time_created_ns", 0),
        # JSON writes 0 where pickle writes None: both mean "not observed".
        (started or None) if type(started) is int or started is None else _optional_time(started, norm, "time_discovered_started_ns"),
        (completed or None) if type(completed) is int or completed is None else _optional_time(completed, norm, "time_discovered_completed_ns"),
        float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None,
        timeout if type(timeout) is int or timeout is None else integer(timeout, "timeout_ms", None),
        norm.stack(get("frames")),
    )


def _parse_rank_list(value) -> Optional[tuple]:
    if isinstance(value, (list, tuple)):
        ranks = value
    elif isinstance(value, str):
        try:
            ranks = ast.literal_eval(value.strip() or "[]")  # literal syntax only, never code
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    else:
        return None
    if not isinstance(ranks, (list, tuple)) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        return None
    return tuple(sorted(set(ranks))) or None


def _pg_config(raw, norm: _Normaliser) -> tuple:
    if not isinstance(raw, dict):
        if raw is not None:
            norm.warn("pg_config is not a dict")
        return ()
    configs = []
    for key, value in raw.items():
        if not isinstance(value, dict):
            norm.warn("a pg_config value is not a dict")
            continue
        name = norm.text(value.get("name", key), "pg_config name")
        configs.append(PgConfig(name, norm.text(value.get("desc"), "pg_config desc"), _parse_rank_list(value.get("ranks"))))
    return tuple(configs)


def _pg_status(raw, norm: _Normaliser) -> dict:
    if not isinstance(raw, dict):
        return {}
    status = {}
    for key, value in raw.items():
        pg_id = norm.integer(key, "pg_status key", None)
        if pg_id is None or not isinstance(value, dict):
            norm.warn("pg_status has an odd entry")
            continue
        status[pg_id] = PgStatus(
            norm.integer(value.get("last_enqueued_collective"), "last_enqueued_collective", None),
            norm.integer(value.get("last_started_collective"), "last_started_collective", None),
            norm.integer(value.get("last_completed_collective"), "last_completed_collective", None),
        )
    return status


def normalise_dump(raw, rank: int, path: str, encoding: str) -> RankDump:
    """Fold one decoded dump (any version) into a `RankDump`. Raises DecodeError when
    the data is not shaped like a dump at all."""
    if isinstance(raw, list):  # the oldest producers wrote a bare list of entries
        raw = {"entries": raw, "version": "1.0"}
    if not isinstance(raw, dict):
        raise DecodeError(f"top level is a {type(raw).__name__}, not a dump dict")
    known = ("entries", "pg_config", "pg_status", "version")
    if not any(key in raw for key in known):
        raise DecodeError("no Flight Recorder keys (entries, pg_config, version) at the top level")
    norm = _Normaliser()
    version = raw.get("version")
    version = version if isinstance(version, str) else ("unknown" if version is None else str(version))
    comm_lib = raw.get("comm_lib_version", raw.get("nccl_version", raw.get("xccl_version", "")))
    pg_config = _pg_config(raw.get("pg_config"), norm)
    raw_entries = raw.get("entries")
    if raw_entries is not None and not isinstance(raw_entries, list):
        norm.warn("entries is not a list (ignored)")
        raw_entries = []
    # JSON dumps omit `entries` when it is empty; only pickles tell "no collectives" apart.
    has_entries = raw_entries is not None or encoding.startswith("json")
    entries = []
    for index, raw_entry in enumerate(raw_entries or ()):
        entry = _normalise_entry(index, raw_entry, norm)
        if entry is not None:
            entries.append(entry)
    entries.sort(key=lambda e: (e.record_id, e.index))
    warnings = tuple(f"{msg} ({n}x)" if n > 1 else msg for msg, n in sorted(norm.warnings.items()))
    return RankDump(
        rank=rank,
        path=path,
        encoding=encoding,
        version=version,
        comm_lib_version=norm.text(comm_lib, "comm_lib_version"),
        pg_config=pg_config,
        pg_status=_pg_status(raw.get("pg_status"), norm),
        entries=tuple(entries),
        has_entries=has_entries,
        warnings=warnings,
    )


# --------------------------------------------------------------------------- loading


def load_one(rank: int, path: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES):
    """Read and normalise one file: a RankDump, or a LoadIssue saying why not."""
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            return LoadIssue(path, f"file is {size:,} bytes, over the {max_bytes:,}-byte limit (raise --max-file-size)")
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return LoadIssue(path, f"cannot read ({exc.strerror or exc})")
    try:
        raw, encoding = decode_dump_bytes(data, max_bytes)
        del data
        return normalise_dump(raw, rank, path, encoding)
    except DecodeError as exc:
        return LoadIssue(path, str(exc))
    except (RecursionError, MemoryError) as exc:
        return LoadIssue(path, f"dump too deep or too large ({type(exc).__name__})")


def _load_star(args: tuple):
    return load_one(*args)


def load_dumps(
    inputs: Sequence,
    prefix: Optional[str] = None,
    *,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    selected_ranks: Optional[Iterable[int]] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> LoadResult:
    """Find and load every dump under `inputs` (directories or files)."""
    paths = [Path(p) for p in inputs]
    files, skipped, family = find_dump_files(paths, prefix)
    if selected_ranks is not None:
        wanted = set(selected_ranks)
        files = [(rank, path) for rank, path in files if rank in wanted]
    jobs = [(rank, str(path), max_bytes) for rank, path in files]
    results = _run_jobs(jobs, workers, progress)
    dumps, errors = [], []
    for (rank, _path, _limit), result in zip(jobs, results):
        (dumps if isinstance(result, RankDump) else errors).append(result)
    failed = tuple(sorted(rank for (rank, path, _), result in zip(jobs, results) if not isinstance(result, RankDump)))
    return LoadResult(dumps=dumps, skipped=skipped, errors=errors, prefix=family, failed_ranks=failed)


def _run_jobs(jobs: list, workers: int, progress) -> list:
    # Worker processes only pay off once there are many files to spread.
    if workers <= 1 or len(jobs) < 2 * workers:
        results = []
        for done, job in enumerate(jobs, 1):
            results.append(load_one(*job))
            if progress:
                progress(done, len(jobs))
        return results
    results = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for done, result in enumerate(pool.map(_load_star, jobs, chunksize=max(1, min(64, len(jobs) // (8 * workers)))), 1):
            results.append(result)
            if progress:
                progress(done, len(jobs))
    return results
