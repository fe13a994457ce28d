"""Find dump files, read them safely and normalise them.

Takes directories and/or files; returns a `LoadResult` with one `RankDump` per rank
(sorted by rank), the unrelated files that were skipped and the dump files that could
not be used. Every dump version (2.0 … 2.11) and backend is folded into one compact
`Entry` record; odd or missing fields become warnings, never exceptions. Nothing here
prints: the caller decides what to say.
"""

from __future__ import annotations

import faulthandler
import functools
import io
import multiprocessing
import operator
import os
import pickle
import re
import signal
import stat
import threading
from collections import Counter, deque
from array import array
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import islice, repeat
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Sequence

from .batches import settle_batches, settle_finished
from .entry_columns import Columns, SharedValues, columns_from_entries, columns_from_raw, entries_from_columns, pack, unpack
from .model import UNREADABLE_OP, Entry, Frame, LoadIssue, LoadResult, OpName, PgConfig, PgStatus, RankDump, Shapes
from .generations import DumpFile, SameRankTwice, choose_generation, describe, require_one_file_per_rank
from .safe_decode import DecodeError, MayNestTooDeeply, decode_dump_bytes
from .sniff import OWN_OUTPUTS, FileKind, classify_file, classify_head
from .sources import RefusedMember, Source, SourceError, as_input, expand_input, needs_expanding
from .standing import keeps_only_active
from .util import cyclic_gc_paused

DEFAULT_MAX_FILE_BYTES = 2 * 1024**3
# A ring buffer keeps 2,000 entries by default (TORCH_NCCL_TRACE_BUFFER_SIZE); jobs that
# raise it use 20,000 or so. A file holding more is refused before normalising: 8 KB of
# pickle memo references can name one entry four million times, and each becomes an
# Entry of its own (3 GB, 73 s before this limit).
DEFAULT_MAX_ENTRIES = 500_000
# Suffixes a dump file may carry after its rank number, stripped right to left.
DUMP_SUFFIXES = (".gz", ".pkl", ".pickle", ".json", ".bin", ".dump", ".trace")
# Words that mark a naming family as Flight Recorder dumps rather than, say, core files.
DUMP_NAME_HINTS = ("rank", "trace", "dump", "fr_", "nccl", "comm")
_FRAME_FIELDS = operator.itemgetter("name", "filename", "line")
_RECORD_ORDER = operator.attrgetter("record_id", "index")
_TRAILING_RANK = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_P2P_NAME = re.compile(r"^(?P<op>send|recv)\s+(?P<a>-?\d+|\?)\s*(?P<arrow>->|<-)\s*(?P<b>-?\d+|\?)$")


class InputError(Exception):
    """The inputs as a whole cannot be analysed (message is one line for the user)."""


# --------------------------------------------------------------------------- discovery


class _Candidate:
    __slots__ = ("path", "prefix", "rank", "tag")

    def __init__(self, path: Path, prefix: str, rank: int, tag: str = ""):
        # tag: what marks another generation of the same rank (`.1` in `rank_3.1`)
        self.path, self.prefix, self.rank, self.tag = path, prefix, rank, tag


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


def _expand_inputs(inputs: Sequence, issues: list, refused: Optional[list] = None,
                   max_bytes: int = DEFAULT_MAX_FILE_BYTES, prefix: Optional[str] = None) -> list:
    files: list = []
    for item in inputs:
        if needs_expanding(item):  # a URL or an archive: its objects or members (sources.py)
            wanted = lambda name: parse_rank_from_name(name, prefix) is not None  # noqa: E731
            problems: list = []
            try:
                files.extend(expand_input(item, max_bytes, wanted, problems))
            except SourceError as exc:
                raise InputError(str(exc)) from None
            if refused is not None:
                refused.extend(LoadIssue(str(where), problem) for where, problem in problems)
        elif item.is_dir():
            files.extend(_walk_files(item))
        elif item.is_file():
            files.append(item)
        elif item.exists():
            issues.append(LoadIssue(str(item), "not a regular file or directory"))
        else:
            raise InputError(f"{item}: no such file or directory")
    return files


# How torch's own default and documented dump names end, before the rank.
TORCH_DUMP_PREFIXES = ("rank_", "_dump_", "trace_")
# A family is confirmed as dumps by the content of one of its first few files: enough to
# tell man pages (`pg_waldump.1.gz`) from dumps, cheap in a directory of 16,384 dumps.
SNIFF_PER_FAMILY = 8
# Name endings frtrace's own outputs can have that also pass for dump suffixes.
_OUTPUT_LIKE_SUFFIXES = (".pkl", ".pickle", ".json", ".gz")
_GENERATION_TAG = re.compile(r"^(?P<prefix>.*\D)(?P<rank>\d+)(?P<tag>\.)$")


def _family_score(counts: Counter):
    def score(family: str) -> tuple:
        hinted = any(hint in family.lower() for hint in DUMP_NAME_HINTS)
        return (hinted, counts[family], family)

    return score


def _pick_family(candidates: list) -> Optional[str]:
    """The naming family of the dumps: the best-scoring one whose content says dump;
    failing that (every file broken), the best whose name says dump. None for neither."""
    by_family: dict = {}
    for cand in candidates:
        by_family.setdefault(_naming_family(cand.prefix), []).append(cand)
    ranked = sorted(by_family, key=_family_score(Counter({f: len(c) for f, c in by_family.items()})), reverse=True)
    kinds = {family: {_classify(c.path) for c in by_family[family][:SNIFF_PER_FAMILY]} for family in ranked}
    for family in ranked:
        if FileKind.DUMP in kinds[family]:
            return family
    # Every dump broken (the user wants to hear which, and why): named the way torch names
    # dumps, or like dumps and pickle, JSON or empty; not binaries or man pages whose
    # names merely hold a word (`llvm-objdump-14`, `pg_waldump.1.gz`).
    for family in ranked:
        hinted = any(hint in family.lower() for hint in DUMP_NAME_HINTS)
        if family.lower().endswith(TORCH_DUMP_PREFIXES) or (
                hinted and not family.endswith(".") and kinds[family] & {FileKind.DATA, FileKind.EMPTY}):
            return family
    return None


def _is_own_output(cand: _Candidate, skipped: list) -> bool:
    """frtrace's Database, SQLite or timeline file left among the dumps (by its content)."""
    if not cand.path.name.lower().endswith(_OUTPUT_LIKE_SUFFIXES):
        return False
    kind = _classify(cand.path)
    if kind in OWN_OUTPUTS:
        skipped.append(LoadIssue(str(cand.path), f"{kind.value} (an output of frtrace), not a dump"))
        return True
    return False


def _with_generation_tags(candidates: list) -> list:
    """`rank_3.1` next to `rank_3`: rank 3 of another generation, not rank 1 of `rank_3.`.
    Only when the plain family exists, so `job3.0, job3.1, ...` keep their ranks."""
    plain = {_naming_family(c.prefix) for c in candidates}
    tagged = []
    for cand in candidates:
        match = _GENERATION_TAG.match(cand.prefix)
        if match and _naming_family(match["prefix"]) in plain:
            cand = _Candidate(cand.path, match["prefix"], int(match["rank"]), f".{cand.rank}")
        tagged.append(cand)
    return tagged


def _classify(path) -> FileKind:
    """`classify_file` for a local path or a Source (an object in a store, an archive member)."""
    if isinstance(path, Source):
        try:
            return classify_head(path.head())
        except (OSError, ValueError, SourceError):
            return FileKind.OTHER
    return classify_file(path)


class Discovery(NamedTuple):
    files: list  # [(rank, path)] sorted by rank
    skipped: list  # LoadIssue for each file not taken
    prefix: str  # the naming family, digits shown as N
    notes: list  # one line each for the user: several generations found, which one is read
    # archive members refused by name or type, archives cut short: LoadIssue each (errors, not skips)
    refused: tuple = ()


def discover_dump_files(inputs: Sequence, prefix: Optional[str] = None, all_generations: bool = False,
                        max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Discovery:
    """The dump files under `inputs`, one per rank, of the newest complete generation
    (see generations.py) unless `all_generations`.

    Without `prefix`, the naming family most files share (digits inside host names are
    treated alike) and whose content is a dump wins; other files are skipped with a
    reason, and so are frtrace's own outputs.
    """
    skipped: list = []
    refused: list = []
    candidates = []
    for path in _expand_inputs(inputs, skipped, refused, max_bytes, prefix):
        if isinstance(path, RefusedMember) and not path.candidate:
            refused.append(LoadIssue(str(path), path.reason))  # a link, a `..` name: never a rank's dump
            continue
        parsed = parse_rank_from_name(path.name, prefix)
        if parsed is None:
            reason = "no rank number in the file name" if prefix is None else f"name does not start with {prefix!r}"
            skipped.append(LoadIssue(str(path), reason))
        else:
            candidates.append(_Candidate(path, parsed[0], parsed[1]))
    candidates = _with_generation_tags([c for c in candidates if not _is_own_output(c, skipped)])
    family = _naming_family(prefix) if prefix is not None else _pick_family(candidates) if candidates else None
    if family is None:
        skipped.extend(LoadIssue(str(c.path), "not a Flight Recorder dump") for c in candidates)
        return Discovery([], skipped, prefix or "", [], tuple(refused))
    chosen = []
    for cand in candidates:
        if prefix is None and _naming_family(cand.prefix) != family:
            skipped.append(LoadIssue(str(cand.path), f"name does not follow the dump naming {family.replace('#', 'N')}<rank>"))
        else:
            chosen.append(DumpFile(cand.rank, cand.path, cand.tag, _mtime(cand.path)))  # type: ignore[arg-type]  # None until _times_known
    files, notes = _one_generation(_times_known(chosen), skipped, all_generations)
    return Discovery(sorted(files), skipped, family.replace("#", "N"), notes, tuple(refused))


def _mtime(path) -> Optional[float]:
    if isinstance(path, Source):
        return path.mtime
    try:
        info = os.stat(path)
    except OSError:
        return None  # reading it says why
    # A device or FIFO named like a dump carries no dump's time (and is refused when read).
    return info.st_mtime if stat.S_ISREG(info.st_mode) else None


def _times_known(files: list) -> list:
    """Files whose time says nothing go with the newest: never a generation of their own."""
    newest = max((f.mtime for f in files if f.mtime is not None), default=0.0)
    return [f if f.mtime is not None else f._replace(mtime=newest) for f in files]


def _one_generation(files: list, skipped: list, all_generations: bool) -> tuple:
    """`([(rank, path)], notes)` of the generation to analyse; the others join `skipped`."""
    try:
        if all_generations:
            require_one_file_per_rank(files)
            return [(f.rank, f.path) for f in files], []
        choice = choose_generation(files)
    except SameRankTwice as exc:
        raise InputError(f"{exc} (pass one directory, or choose with --prefix)") from None
    if choice is None:
        return [], []
    newest = choice.chosen.newest
    for f in choice.left_out:
        minutes = abs(newest - f.mtime) / 60
        skipped.append(LoadIssue(str(f.path), f"another generation of dumps (written {minutes:.0f} min "
                                 f"{'before' if f.mtime <= newest else 'after'} the analysed ones): not mixed with them"))
    notes = [describe(choice)] if choice.others else []
    return [(f.rank, f.path) for f in choice.chosen.files], notes


def find_dump_files(inputs: Sequence[Path], prefix: Optional[str] = None) -> tuple:
    """`(files, skipped, prefix_used)` of `discover_dump_files`: files is a sorted list of (rank, path)."""
    found = discover_dump_files(inputs, prefix)
    return found.files, found.skipped, found.prefix


# --------------------------------------------------------------------------- normalising

# Producers write 64-bit integers; anything wider is corruption, and printing an int of
# thousands of digits is itself an error in Python.
_INT_LIMIT = 2**64
_ENTRY_FIELDS = (
    "record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "is_p2p",
    "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state", "retired", "time_created_ns",
    "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms", "timeout_ms", "frames",
)
_new_entry = tuple.__new__  # builds an Entry from a ready tuple without a Python-level __new__


class _Unreadable(Exception):
    """An entry field that matching depends on cannot be read: the entry is dropped."""


@dataclass(slots=True)
class BatchMemo:
    """What reading one file teaches about the next files of the same batch (a worker's
    batch, or an in-process load): stacks validated without a warning, which validating
    again would give alike and say nothing about (~40 µs each), and parsed rank lists
    (every rank lists the whole world: 6 ms to parse at 16,384 ranks)."""

    clean_stacks: dict = field(default_factory=dict)
    rank_lists: dict = field(default_factory=dict)


class _Normaliser:
    """Per-file interning tables and the warnings collected while normalising.

    The tables map raw values (as the file holds them) to validated, interned results,
    so the common entry costs a few dict lookups; only values not seen before are
    validated field by field.
    """

    def __init__(self, memo: Optional[BatchMemo] = None) -> None:
        self.strings: dict = {}
        self.groups: dict = {}
        self.names: dict = {}
        self.shapes: dict = {}
        self.frames: dict = {}
        self.stacks: dict = {}
        memo = BatchMemo() if memo is None else memo
        self.clean_stacks: dict = memo.clean_stacks
        self.rank_lists: dict = memo.rank_lists
        self.warnings: Counter = Counter()
        self.warned = 0

    def warn(self, message: str) -> None:
        self.warnings[message] += 1
        self.warned += 1

    def rank_list(self, value) -> Optional[tuple]:
        if not isinstance(value, str):
            return _parse_rank_list(value)
        if value not in self.rank_lists:
            self.rank_lists[value] = _parse_rank_list(value)
        return self.rank_lists[value]

    def text(self, value, field_name: str, default: str = "") -> str:
        if value is None:
            return default
        if not isinstance(value, str):
            # Never str() it: a shared-reference tuple can expand to billions of items.
            self.warn(f"{field_name} is not a string")
            return default
        return self.strings.setdefault(value, value)

    def integer(self, value, field_name: str, default: Optional[int] = 0) -> Optional[int]:
        if type(value) is int and -_INT_LIMIT < value < _INT_LIMIT:
            return value
        if value is None:
            return default
        number = _as_integer(value)
        if number is None:
            self.warn(f"{field_name} is not an integer")
            return default
        return number

    def process_group(self, pg, pg_id) -> tuple:
        if not isinstance(pg, (list, tuple)) or not pg:
            return self._validated_process_group(pg, pg_id)
        try:  # JSON writes the pair as a list: the cache is keyed by the tuple
            key = tuple(pg)
            cached = self.groups.get(key)
        except TypeError:  # something unhashable inside
            return self._validated_process_group(pg, pg_id)
        if cached is None:
            cached = self.groups[key] = self._validated_process_group(pg, pg_id)
        return cached

    def _validated_process_group(self, pg, pg_id) -> tuple:
        if isinstance(pg, (list, tuple)) and len(pg) >= 1:
            name = self.text(pg[0], "process_group name")
            desc = self.text(pg[1], "process_group desc") if len(pg) > 1 else ""
            return name, desc
        if pg is not None:
            self.warn("process_group is not a (name, desc) pair")
        # Old dumps without process_group: the rank-local pg_id is the only handle left.
        number = self.integer(pg_id, "pg_id", None)
        return (str(number) if number is not None else "?"), ""

    def op_name(self, profiling_name, is_p2p_flag) -> OpName:
        flag = is_p2p_flag is True
        if type(profiling_name) is not str:
            if profiling_name is not None:
                self.warn("profiling_name is not a string")
            return UNREADABLE_OP
        key = (profiling_name, flag)
        cached = self.names.get(key)
        if cached is None:
            cached = self.names[key] = parse_profiling_name(self.text(profiling_name, "profiling_name"), flag)
        return cached

    def sizes(self, value, field_name: str) -> Optional[tuple]:
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(
            isinstance(shape, (list, tuple)) and all(type(d) is int and 0 <= d < _INT_LIMIT for d in shape) for shape in value
        ):
            return tuple(map(tuple, value))
        self.warn(f"{field_name} is not a list of shapes")
        return None

    def dtypes(self, value, field_name: str) -> Optional[tuple]:
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(isinstance(d, str) for d in value):
            return tuple(self.text(d, field_name) for d in value)
        self.warn(f"{field_name} is not a list of dtype names")
        return None

    def shape_record(self, input_sizes, input_dtypes, output_sizes, output_dtypes) -> Shapes:
        try:  # most entries repeat a handful of shapes: look the raw values up first
            key = (tuple(map(tuple, input_sizes or ())), tuple(input_dtypes or ()),
                   tuple(map(tuple, output_sizes or ())), tuple(output_dtypes or ()))
            cached = self.shapes.get(key)
        except TypeError:  # not iterable, or unhashable inside: validate the slow way
            key, cached = None, None
        if cached is not None:
            return cached
        fields = (
            self.sizes(input_sizes, "input_sizes"),
            self.dtypes(input_dtypes, "input_dtypes"),
            self.sizes(output_sizes, "output_sizes"),
            self.dtypes(output_dtypes, "output_dtypes"),
        )
        readable = None not in fields
        sizes_in, dtypes_in, sizes_out, dtypes_out = (() if f is None else f for f in fields)
        shapes = Shapes(sizes_in, dtypes_in, sizes_out, dtypes_out, readable)
        shapes = self.shapes.setdefault(shapes, shapes)
        if key is not None:
            self.shapes[key] = shapes
        return shapes

    def stack(self, value) -> tuple:
        if not value:
            return ()
        try:  # a stack seen before, looked up by its raw (name, file, line)s
            key = tuple(map(_FRAME_FIELDS, value))
            cached = self.stacks.get(key)
        except (TypeError, KeyError):
            key, cached = None, None
        if cached is not None:
            return cached
        if key is not None and key in self.clean_stacks:
            stack = self.stacks[key] = self.clean_stacks[key]
            return stack
        warned = self.warned
        stack = self._validated_stack(value)
        if key is not None:
            self.stacks[key] = stack
            if self.warned == warned:
                self.clean_stacks[key] = stack
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
            frame = Frame(
                self.text(raw.get("name"), "frame name", "?"),
                self.text(raw.get("filename"), "frame filename", "?"),
                self.integer(raw.get("line"), "frame line", 0) or 0,
            )
            frames.append(self.frames.setdefault(frame, frame))
        stack = tuple(frames)
        return self.stacks.setdefault(stack, stack)


def _as_integer(value) -> Optional[int]:
    """An int written as a decimal string or an integral float; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_INT_LIMIT < value < _INT_LIMIT else None
    if isinstance(value, str):
        digits = value.strip()
        if 0 < len(digits) <= 21 and digits.lstrip("-").isascii() and digits.lstrip("-").isdecimal():
            return int(digits)
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < _INT_LIMIT:
        return int(value)
    return None


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
    op = rest.split(" ", 1)[0] if rest else UNREADABLE_OP.op
    marker = op == "coalesced" or (op.endswith("_coalesced") and op[: -len("_coalesced")].isupper())
    return OpName(profiling_name, backend, op, is_p2p_flag or op in ("send", "recv"), None, None, marker)


def _optional_time(value, norm: _Normaliser, field_name: str) -> Optional[int]:
    # JSON writes 0 where pickle writes None: both mean "not observed".
    return norm.integer(value, field_name, None) or None


def _optional_float(value, norm: _Normaliser, field_name: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300:
        value = float(value)
        if value == value:  # not NaN
            return value
    norm.warn(f"{field_name} is not a number")
    return None


def _fast_entry(index: int, values: tuple, norm: _Normaliser):
    """The entry from `values` when every field holds what real dumps hold and every
    interned value was seen before; None to take the validating path."""
    (record_id, pg_id, pg, seq, p2p_seq, op_id, profiling_name, is_p2p, input_sizes, input_dtypes, output_sizes,
     output_dtypes, state, retired, created, started, completed, duration, timeout, frames) = values
    limit = _INT_LIMIT
    if not (type(record_id) is int and type(pg_id) is int and type(seq) is int and type(p2p_seq) is int
            and type(op_id) is int and type(created) is int and (started is None or type(started) is int)
            and (completed is None or type(completed) is int) and (timeout is None or type(timeout) is int)
            and (retired is None or type(retired) is bool) and (duration is None or type(duration) is float)
            and -limit < record_id < limit and -limit < seq < limit and -limit < p2p_seq < limit
            and -limit < op_id < limit and -limit < created < limit and -limit < pg_id < limit
            and (started is None or -limit < started < limit) and (completed is None or -limit < completed < limit)
            and (timeout is None or -limit < timeout < limit) and (duration is None or -1e300 < duration < 1e300)):
        return None
    try:
        group = norm.groups[tuple(pg)]
        name = norm.names[(profiling_name, is_p2p is True)]
        shapes = norm.shapes[(tuple(map(tuple, input_sizes)), tuple(input_dtypes),
                              tuple(map(tuple, output_sizes)), tuple(output_dtypes))]
        state = norm.strings[state]
        stack = norm.stacks[tuple(map(_FRAME_FIELDS, frames))] if frames else ()
    except (KeyError, TypeError):
        return None
    return _new_entry(Entry, (index, record_id, group[0], group[1], pg_id, seq, p2p_seq, op_id, name, shapes, state,
                              retired, created, started or None, completed or None, duration, timeout, stack))


def _validated_entry(index: int, values: tuple, norm: _Normaliser) -> Entry:
    (record_id, pg_id, pg, seq, p2p_seq, op_id, profiling_name, is_p2p, input_sizes, input_dtypes, output_sizes,
     output_dtypes, state, retired, created, started, completed, duration, timeout, frames) = values
    integer = norm.integer
    name = norm.op_name(profiling_name, is_p2p)
    collective_seq = integer(seq, "collective_seq_id", None)
    if collective_seq is None and not name.is_p2p:
        # Where this rank stands in its group cannot be known: better no entry than a guess.
        raise _Unreadable("collective_seq_id")
    group = norm.process_group(pg, pg_id)
    if not (retired is None or type(retired) is bool):
        norm.warn("retired is not a boolean")
        retired = None
    return _new_entry(Entry, (
        index,
        integer(record_id, "record_id", index),
        group[0],
        group[1],
        integer(pg_id, "pg_id", -1),
        collective_seq if collective_seq is not None else 0,
        integer(p2p_seq, "p2p_seq_id", 0),
        integer(op_id, "op_id", 0),
        name,
        norm.shape_record(input_sizes, input_dtypes, output_sizes, output_dtypes),
        norm.text(state, "state", "scheduled"),
        retired,
        integer(created, "time_created_ns", 0),
        _optional_time(started, norm, "time_discovered_started_ns"),
        _optional_time(completed, norm, "time_discovered_completed_ns"),
        _optional_float(duration, norm, "duration_ms"),
        integer(timeout, "timeout_ms", None),
        norm.stack(frames),
    ))


_RANK_LIST = re.compile(r"\s*[\[(]\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*[\])]\s*")


def _parse_rank_list(value) -> Optional[tuple]:
    """Sorted global ranks from `"[0, 1, 2]"` (or a list), None when unreadable or empty.

    A regular expression rather than ast.literal_eval: the default group of a large job
    lists every rank, and compiling that string costs more than the rest of the file.
    """
    if isinstance(value, (list, tuple)):
        if not all(type(r) is int and 0 <= r < _INT_LIMIT for r in value):
            return None
        ranks = value
    elif isinstance(value, str):
        match = _RANK_LIST.fullmatch(value)
        if match is None:
            return None
        numbers = match[1]
        if numbers and max(map(len, numbers.split(","))) > 25:
            return None
        ranks = list(map(int, numbers.split(","))) if numbers else []
    else:
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
        configs.append(PgConfig(name, norm.text(value.get("desc"), "pg_config desc"), norm.rank_list(value.get("ranks"))))
    return tuple(configs)


def _pg_status(raw, norm: _Normaliser) -> dict:
    if not isinstance(raw, dict):
        if raw is not None:
            norm.warn("pg_status is not a dict")
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


def _top_level_dict(raw) -> dict:
    if isinstance(raw, list):
        # The oldest producers wrote a bare list of entries; a list of anything else is not a dump.
        if raw and all(map(isinstance, raw, repeat(dict))):
            return {"entries": raw, "version": "1.0"}
        raise DecodeError("top level is a list, but not of entry dicts")
    if not isinstance(raw, dict):
        raise DecodeError(f"top level is a {type(raw).__name__}, not a dump dict")
    if not any(key in raw for key in ("entries", "pg_config", "pg_status", "version")):
        raise DecodeError("no Flight Recorder keys (entries, pg_config, version) at the top level")
    return raw


def _raw_entries(raw_entries, max_entries: int = DEFAULT_MAX_ENTRIES) -> Optional[list]:
    """The `entries` list, None when the dump has none; DecodeError when it holds no entry
    at all, since such a rank would otherwise look like one that issued nothing, or more
    than `max_entries`."""
    if raw_entries is None:
        return None
    if not isinstance(raw_entries, list):
        raise DecodeError(f"entries is a {type(raw_entries).__name__}, not a list")
    if len(raw_entries) > max_entries:
        raise DecodeError(f"holds {len(raw_entries):,} entries, over the limit of {max_entries:,} per file "
                          f"(a ring buffer keeps 2,000 by default)")
    if raw_entries and not any(isinstance(item, dict) for item in raw_entries):
        raise DecodeError("entries holds no entry dicts")
    return raw_entries


def _normalise_entries(raw_entries: list, norm: _Normaliser) -> tuple:
    """`(Columns of the entries sorted oldest first, number dropped as unreadable)`."""
    columns = columns_from_raw(raw_entries, norm)
    if columns is not None:
        return columns, 0
    entries, dropped = _entries_one_by_one(raw_entries, norm)
    return columns_from_entries(entries), dropped


def _entries_one_by_one(raw_entries: list, norm: _Normaliser) -> tuple:
    """`(entries sorted oldest first, number dropped as unreadable)`: the path for dumps with
    anything unusual in them, which checks and warns about each value on its own."""
    entries = []
    dropped = 0
    fields = _ENTRY_FIELDS
    for index, raw in enumerate(raw_entries):
        if type(raw) is not dict:
            norm.warn("an entry is not a dict (skipped)")
            continue
        values = tuple(map(raw.get, fields))
        if values[3] is None:  # dumps before the collective/p2p split wrote `seq_id`
            values = values[:3] + (raw.get("seq_id"),) + values[4:]
        entry = _fast_entry(index, values, norm)
        if entry is None:
            try:
                entry = _validated_entry(index, values, norm)
            except _Unreadable as exc:
                norm.warn(f"an entry has no readable {exc} (dropped)")
                dropped += 1
                continue
        entries.append(entry)
    # Record ids order a rank's entries; ties (corrupt ids) keep file order.
    entries.sort(key=_RECORD_ORDER)
    return tuple(entries), dropped


def _version(raw: dict, norm: _Normaliser) -> str:
    version = raw.get("version")
    if isinstance(version, str):
        return version
    if version is not None:
        norm.warn("version is not a string")
    return "unknown"


def normalise_dump(raw, rank: int, path: str, encoding: str) -> RankDump:
    """Fold one decoded dump (any version) into a `RankDump`. Raises DecodeError when
    the data is not shaped like a dump at all."""
    dump, columns = _normalised(raw, rank, path, encoding)
    _set_entries(dump, columns)
    return dump


def _set_entries(dump: RankDump, columns: Columns, shared: Optional[SharedValues] = None) -> None:
    """The dump's entries from `columns`, each coalesced batch settled as one unit, and in
    a dump of only active entries, those its pg_status says finished (see `batches`)."""
    dump.entries = settle_batches(entries_from_columns(columns, shared))
    if keeps_only_active(dump):
        dump.entries = settle_finished(dump.entries, dump.pg_status)


def _normalised(raw, rank: int, path: str, encoding: str, memo: Optional[BatchMemo] = None,
                max_entries: int = DEFAULT_MAX_ENTRIES) -> tuple:
    """`(RankDump without its entries, Columns of its entries)`."""
    raw = _top_level_dict(raw)
    raw_entries = _raw_entries(raw.get("entries"), max_entries)
    norm = _Normaliser(memo)
    comm_lib = raw.get("comm_lib_version", raw.get("nccl_version", raw.get("xccl_version", "")))
    columns, dropped = _normalise_entries(raw_entries or [], norm)
    dump = RankDump(
        rank=rank,
        path=path,
        encoding=encoding,
        version=_version(raw, norm),
        comm_lib_version=norm.text(comm_lib, "comm_lib_version"),
        pg_config=_pg_config(raw.get("pg_config"), norm),
        pg_status=_pg_status(raw.get("pg_status"), norm),
        entries=(),
        # JSON dumps omit `entries` when it is empty; only pickles tell "no collectives" apart.
        has_entries=raw_entries is not None or encoding.startswith("json"),
        unreadable_entries=dropped,
    )
    dump.warnings = tuple(f"{msg} ({n}x)" if n > 1 else msg for msg, n in sorted(norm.warnings.items()))
    return dump, columns


# --------------------------------------------------------------------------- loading


def read_dump_file(path: str, max_bytes: int, drop_from_cache: bool = False) -> bytes:
    """The bytes of one regular file of at most `max_bytes`; OSError or ValueError otherwise.

    Opened without blocking and checked on the open descriptor, so a FIFO or a device
    named like a dump (or a symlink to one) is refused instead of read forever.
    `drop_from_cache` asks the kernel to forget the file's pages once read (see
    `_inputs_crowd_memory`).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb", closefd=True) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"file is {info.st_size:,} bytes, over the {max_bytes:,}-byte limit (raise --max-file-size)")
        data = handle.read(info.st_size + 1)
        if len(data) > info.st_size:  # still being written: read on, in bounded steps
            parts, size = [data], len(data)
            while size <= max_bytes and (chunk := handle.read(1 << 24)):
                parts.append(chunk)
                size += len(chunk)
            data = b"".join(parts)
        if drop_from_cache and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:  # only advice: a file system may not take it
                pass
    if len(data) > max_bytes:
        raise ValueError(f"file is over the {max_bytes:,}-byte limit (raise --max-file-size)")
    return data


# Dumps larger than this share of the machine's memory are dropped from the page cache
# once read (see _inputs_crowd_memory).
CACHE_SHARE = 0.25


def _inputs_crowd_memory(paths: Sequence) -> bool:
    """Whether the dump files are large next to this machine's memory. Then the page cache
    holding them would crowd out the memory the analysis needs (about 1.5 times their
    size): past free memory, every page the main process touches first makes the kernel
    evict a cached page, which measured 4x slower per page here (14 us instead of 3.4;
    35 s of a 16,384-rank run). A second run reads them from disk again instead."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    total = 0
    for path in paths:
        if isinstance(path, Source):
            continue  # not in this machine's page cache
        try:
            total += os.stat(path).st_size
        except OSError:
            continue  # reported when it is read
    return total > CACHE_SHARE * memory


def _read_source(path, max_bytes: int, drop_from_cache: bool = False):
    """The bytes of a dump file (a local path, or a Source: an object in a store, an
    archive member), or a LoadIssue saying why they cannot be read."""
    try:
        if isinstance(path, Source):
            return path.read(max_bytes)
        return read_dump_file(path, max_bytes, drop_from_cache)
    except OSError as exc:
        return LoadIssue(str(path), f"cannot read ({exc.strerror or exc})")
    except (ValueError, SourceError) as exc:
        return LoadIssue(str(path), str(exc))


def _decoding_is_capped() -> bool:
    """Whether this process may lower its address-space limit while it decodes (see
    safe_decode._address_space_cap): not while other threads run (a dask worker, or
    fsspec's I/O thread). There, pickles are decoded in a forked single-threaded child
    instead, so that the same limits hold, and the same results come out, everywhere."""
    return threading.active_count() <= 1


def load_one(rank: int, path, max_bytes: int = DEFAULT_MAX_FILE_BYTES, drop_from_cache: bool = False, *,
             packed: bool = False, shared: Optional[SharedValues] = None, memo: Optional[BatchMemo] = None,
             data: Optional[bytes] = None):
    """Read and normalise one file: a RankDump, or a LoadIssue saying why not.

    `path` is a local path or a Source (sources.py); `data` its bytes when read already.
    `packed` leaves the entries in the compact form `_received` unpacks (for worker
    processes); `shared` holds the values the entries of all ranks share, and
    `memo` what other files of the same batch taught (see BatchMemo)."""
    if data is None:
        data = _read_source(path, max_bytes, drop_from_cache)
        if isinstance(data, LoadIssue):
            return data
    path = str(path)
    if (data[:1] == b"\x80" or data[:2] == b"\x1f\x8b") and not _decoding_is_capped():
        result = _loaded_in_own_process(data, rank, path, max_bytes)
        return _received(result, shared or SharedValues()) if isinstance(result, RankDump) and not packed else result
    result = _loaded(data, rank, path, max_bytes, packed=packed, shared=shared, memo=memo)
    if result is _NEEDS_OWN_PROCESS:
        result = _loaded_in_own_process(data, rank, path, max_bytes)
        if isinstance(result, RankDump) and not packed:
            result = _received(result, shared or SharedValues())
    return result


_NEEDS_OWN_PROCESS = LoadIssue("", "may crash the process that decodes it")


def _loaded(data: bytes, rank: int, path: str, max_bytes: int, *, packed: bool = False,
            shared: Optional[SharedValues] = None, memo: Optional[BatchMemo] = None, isolated: bool = False):
    """`load_one` once the bytes are read; _NEEDS_OWN_PROCESS when decoding them could
    crash this process (and `isolated` does not say it may)."""
    try:
        # A decoded dump is a tree of some 100,000 fresh dicts and lists: the collector
        # would scan it several times over while it is built (10-30% of the load).
        with cyclic_gc_paused():
            raw, encoding = decode_dump_bytes(data, max_bytes, isolated=isolated)
            del data
            dump, columns = _normalised(raw, rank, path, encoding, memo)
            del raw
            if packed:
                dump.entries = pack(columns)
            else:
                _set_entries(dump, columns, shared)
            return dump
    except MayNestTooDeeply:
        return _NEEDS_OWN_PROCESS
    except DecodeError as exc:
        return LoadIssue(path, str(exc))
    except (RecursionError, MemoryError) as exc:
        return LoadIssue(path, f"dump too deep or too large ({type(exc).__name__})")


def _loaded_in_own_process(data: bytes, rank: int, path: str, max_bytes: int):
    """`_loaded` in a child process, packed for transfer: a pickle that crashes the C
    unpickler (see safe_decode.SAFE_TUPLE_OPCODES) then costs this one file. Forked where
    the platform can, so the child inherits `data` instead of receiving a copy."""
    result, exitcode = _in_child(_load_isolated, data, rank, path, max_bytes)
    if result is None:
        return LoadIssue(path, f"pickle nested too deeply or otherwise hostile: decoding it crashed "
                               f"a separate process ({_exit_reason(exitcode)})")
    return result


def _load_isolated(data: bytes, rank: int, path: str, max_bytes: int):
    (result,) = _for_transfer([_loaded(data, rank, path, max_bytes, packed=True, memo=BatchMemo(), isolated=True)])
    return result


def _in_child(function, *args) -> tuple:
    """`(function(*args), None)` computed in a child process, or `(None, exit code)` when
    the child died. Forked where the platform can (with os.fork, so that daemonic processes
    such as dask's and multiprocessing's workers may do it too)."""
    if not hasattr(os, "fork"):
        return _in_spawned_child(function, *args)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, and leave without running any cleanup of the parent's
        code = 1
        try:
            # If this process crashes, the parent names the file in one line: a fault handler
            # inherited from it (python -X faulthandler, pytest) would add a traceback to stderr.
            faulthandler.disable()
            os.close(read_fd)
            with open(write_fd, "wb", closefd=True) as pipe:
                pickle.dump(function(*args), pipe, protocol=pickle.HIGHEST_PROTOCOL)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with open(read_fd, "rb", closefd=True) as pipe:
        payload = pipe.read()  # before waiting: a large result would fill the pipe
    _, status = os.waitpid(pid, 0)
    exitcode = os.waitstatus_to_exitcode(status)
    if exitcode != 0 or not payload:
        return None, exitcode
    # The child is this program on data it checked: its own pickle of its results, read
    # back allowing this package's records and nothing else that could run code.
    return _OwnResultUnpickler(io.BytesIO(payload)).load(), 0


class _OwnResultUnpickler(pickle.Unpickler):
    """Reads what a child of this process pickled: frtrace's own records (and the arrays
    and sets they hold), never another module's callables."""

    _ALLOWED = {("array", "array"), ("array", "_array_reconstructor"), ("builtins", "frozenset"),
                ("builtins", "set"), ("builtins", "range"), ("builtins", "slice")}

    def find_class(self, module: str, name: str):  # type: ignore[no-untyped-def]
        if module.startswith("frtrace.") or (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in a child's result")


def _in_spawned_child(function, *args) -> tuple:
    context = multiprocessing.get_context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_compute_and_send, args=(function, args, sender), daemon=True)
    child.start()
    sender.close()
    try:
        result = receiver.recv()  # before join: a large result would fill the pipe
    except (EOFError, OSError):
        result = None
    finally:
        receiver.close()
    child.join()
    return (result, 0) if result is not None else (None, child.exitcode)


def _compute_and_send(function, args: tuple, sender) -> None:
    faulthandler.disable()
    sender.send(function(*args))
    sender.close()


def _exit_reason(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def _load_batch_for_transfer(jobs: list) -> list:
    """`load_one` for a few files in a worker process. Entries travel to the parent as
    packed columns (arrays and small tables), which pickle at memory speed; an Entry per
    entry would cost a pickle round trip each.

    In a process running other threads (a dask worker), the files are read here, and
    decoded in one forked single-threaded child per batch (see _decoding_is_capped)."""
    if not _decoding_is_capped():
        return _batch_in_own_process(jobs)
    memo = BatchMemo()
    return _for_transfer([load_one(*job, packed=True, memo=memo) for job in jobs])


def _batch_in_own_process(jobs: list) -> list:
    read = [_read_source(job[1], job[2], job[3] if len(job) > 3 else False) for job in jobs]
    results, exitcode = _in_child(_decode_batch, jobs, read)
    if results is None:  # cannot happen short of a bug or the OOM killer: name the files
        reason = f"decoding crashed a separate process ({_exit_reason(exitcode)})"
        return [data if isinstance(data, LoadIssue) else LoadIssue(str(job[1]), reason) for job, data in zip(jobs, read)]
    return results


def _decode_batch(jobs: list, read: list) -> list:
    memo = BatchMemo()
    return _for_transfer([data if isinstance(data, LoadIssue) else
                          load_one(job[0], job[1], job[2], packed=True, memo=memo, data=data)
                          for job, data in zip(jobs, read)])


def _for_transfer(results: list) -> list:
    # Every rank lists the whole world in its default group: sent as arrays (one per list
    # in the batch, which the pickle then writes once), the parent reads them as bytes and
    # keeps one tuple per distinct list (see SharedValues).
    arrays: dict = {}  # id(ranks) -> (ranks, its array): holding ranks keeps the id its own
    for dump in results:
        if isinstance(dump, RankDump):
            dump.pg_config = tuple(config._replace(ranks=_as_array(config.ranks, arrays)) if config.ranks else config
                                   for config in dump.pg_config)
    return results


def _load_batch_mapped(transform: Callable, jobs: list) -> list:
    """`transform(rank, load_one(...))` for a few files in a worker process: only what
    `transform` returns travels back (see iter_dump_files)."""
    memo = BatchMemo()
    return [transform(job[0], load_one(*job, memo=memo)) for job in jobs]


def _as_array(ranks, arrays: dict) -> array:
    if isinstance(ranks, array):  # packed already (by a child process of a worker)
        return ranks
    if id(ranks) not in arrays:
        arrays[id(ranks)] = (ranks, array("q", ranks))
    return arrays[id(ranks)][1]


def _received(result, shared: SharedValues):
    if isinstance(result, RankDump):
        _set_entries(result, unpack(result.entries), shared)
        _share_rank_lists(result, shared)
    return result


def load_dumps(
    inputs: Sequence,
    prefix: Optional[str] = None,
    *,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    selected_ranks: Optional[Iterable[int]] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    on_dump: Optional[Callable[[RankDump], None]] = None,
    all_generations: bool = False,
    runner: Optional[Callable] = None,
) -> LoadResult:
    """Find and load every dump under `inputs` (directories, files, archives, URLs): of
    the newest complete generation only, unless `all_generations` (see discover_dump_files).
    `selected_ranks` keeps only the files of those ranks (by the rank in their name),
    before any is decoded. `on_dump` is called in this process with each dump as it
    arrives: work done there overlaps the workers'. `runner(jobs, progress, shared,
    on_dump)` replaces the local process pool (cluster.DaskRunner); it returns the
    results in job order and notes."""
    found = discover_dump_files([as_input(p) for p in inputs], prefix, all_generations, max_bytes)
    files = found.files
    if selected_ranks is not None:
        wanted = set(selected_ranks)
        files = select_files(files, wanted.__contains__)
    return load_dump_files(files, found, workers=workers, max_bytes=max_bytes, progress=progress, on_dump=on_dump,
                           inputs=tuple(str(p) for p in inputs), runner=runner)


def select_files(files: list, wanted: Callable[[int], bool]) -> list:
    """The `(rank, path)` pairs of `files` whose rank (from the file name) is `wanted`:
    choosing ranks before reading, so the other files are never opened."""
    return [(rank, path) for rank, path in files if wanted(rank)]


def load_dump_files(files: list, found: Discovery, *, workers: int = 1, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
                    progress: Optional[Callable[[int, int], None]] = None,
                    on_dump: Optional[Callable[[RankDump], None]] = None, inputs: tuple[str, ...] = (),
                    runner: Optional[Callable] = None) -> LoadResult:
    """Load `files` (`(rank, path)` pairs, from `found.files` or a selection of them),
    found under `inputs` (as given), in this machine's processes or with `runner`."""
    notes = list(found.notes)
    if runner is None:
        results = [result for _, result in iter_dump_files(files, workers=workers, max_bytes=max_bytes,
                                                            progress=progress, on_dump=on_dump)]
    else:
        results, run_notes = runner(_jobs(files, max_bytes), progress, SharedValues(), on_dump)
        notes += list(run_notes)
    dumps: list[RankDump] = []
    errors: list[LoadIssue] = list(found.refused)
    for result in results:
        (dumps if isinstance(result, RankDump) else errors).append(result)
    failed = tuple(sorted(rank for (rank, _), result in zip(files, results) if not isinstance(result, RankDump)))
    return LoadResult(dumps=dumps, skipped=found.skipped, errors=errors, prefix=found.prefix, failed_ranks=failed,
                      notes=notes, inputs=inputs)


def iter_dump_files(files: list, *, workers: int = 1, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
                    progress: Optional[Callable[[int, int], None]] = None,
                    on_dump: Optional[Callable[[RankDump], None]] = None,
                    transform: Optional[Callable] = None) -> Iterator[tuple]:
    """`(rank, RankDump or LoadIssue)` for each of `files`, in their order, as each is
    decoded: a caller that prints as it goes (`-j`) need not wait for, nor keep, them all.

    With `transform` (a picklable function of `(rank, RankDump or LoadIssue)`), yields
    `(rank, transform(rank, result))` instead, computed in the worker processes: when
    only a little of each dump is wanted (-j's newest entries of each rank), the dumps
    never travel to this process."""
    return _run_jobs(_jobs(files, max_bytes), workers, progress, SharedValues(), on_dump, transform)


def _jobs(files: list, max_bytes: int) -> list:
    """One load job per `(rank, path)`: a local path travels as text, a Source as itself."""
    drop = _inputs_crowd_memory([path for _, path in files])
    return [(rank, path if isinstance(path, Source) else str(path), max_bytes, drop) for rank, path in files]


def _share_rank_lists(dump: RankDump, shared: SharedValues) -> None:
    """Keep one tuple per distinct pg_config rank list, as each dump arrives. Every NCCL
    rank lists the whole world in its default group: at 16,384 ranks, copies of it kept
    until the end of the load took 10 GB."""
    if any(config.ranks for config in dump.pg_config):
        dump.pg_config = tuple(config._replace(ranks=shared.rank_list(config.ranks)) if config.ranks else config
                               for config in dump.pg_config)


def job_batches(jobs: list, workers: int) -> list:
    """The jobs in batches of up to 16, a few per worker (each batch is one task), the
    first few smaller (see _batches)."""
    return _batches(jobs, max(1, min(16, len(jobs) // (8 * workers))))


def take_batch(batch: list, results: list, total: int, shared: SharedValues, on_dump=None, progress=None) -> None:
    """Receive a worker's batch of results into `results`, in this process (see _received)."""
    for result in batch:
        results.append(_received(result, shared))
        if on_dump and isinstance(results[-1], RankDump):
            on_dump(results[-1])
    if progress:
        progress(len(results), total)


def _batches(jobs: list, size: int) -> list:
    """`jobs` cut into batches of `size`, the first few smaller (1, 2, 4, ...): the first
    dumps arrive as soon as one file is decoded, for a caller that prints as it goes."""
    batches, start, step = [], 0, 1
    while start < len(jobs):
        batches.append(jobs[start:start + step])
        start += step
        step = min(size, step * 2)
    return batches


def _run_jobs(jobs: list, workers: int, progress, shared: SharedValues, on_dump=None,
              transform: Optional[Callable] = None) -> Iterator[tuple]:
    """`(rank, result)` per job, in the jobs' order (`transform(rank, result)` with one)."""
    # Worker processes only pay off once there are many files to spread.
    if workers <= 1 or len(jobs) < 2 * workers:
        memo = BatchMemo()
        for done, job in enumerate(jobs, 1):
            result = load_one(*job, shared=shared, memo=memo)
            if transform is not None:
                result = transform(job[0], result)
            elif isinstance(result, RankDump):
                _share_rank_lists(result, shared)
                if on_dump:
                    on_dump(result)
            if progress:
                progress(done, len(jobs))
            yield job[0], result
        return
    batches = iter(job_batches(jobs, workers))
    done = 0
    pool = ProcessPoolExecutor(max_workers=workers)
    finished = False
    try:
        # A few batches in flight per worker, not all of them: when the workers outpace
        # this process, finished batches would otherwise pile up here (gigabytes at 16k ranks).
        work = _load_batch_for_transfer if transform is None else functools.partial(_load_batch_mapped, transform)
        pending = deque((batch, pool.submit(work, batch)) for batch in islice(batches, 3 * workers))
        while pending:
            batch_jobs, future = pending.popleft()
            batch = future.result()
            pending.extend((more, pool.submit(work, more)) for more in islice(batches, 1))
            done += len(batch)
            if progress:
                progress(done, len(jobs))
            for job, result in zip(batch_jobs, batch):
                if transform is None:
                    result = _received(result, shared)
                if on_dump and transform is None and isinstance(result, RankDump):
                    on_dump(result)
                yield job[0], result
        finished = True
    finally:
        if not finished:
            # A consumer that stopped early (its reader gone: `frtrace -j | head`) does not
            # wait for the batches in flight, and the process may end at once (os._exit),
            # before the pool's own thread could tell the workers: end them now, or they
            # would wait for work forever, holding the pipe the output went to.
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)
