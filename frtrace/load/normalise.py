"""Normalise one decoded dump into a `RankDump`.

Takes the decoded object of one file (any dump version 2.0 … 2.11, any backend, written
by c10d's Flight Recorder or by the CUPTI comms monitor: see `cupti`); returns a `RankDump` whose entries are compact `Entry` records (interned strings,
shapes and stacks), coalesced batches settled as units. Odd or missing fields become
warnings, never exceptions; only data not shaped like a dump at all raises DecodeError.
"""

from __future__ import annotations


import dataclasses
import json
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Hashable, Iterable, Optional, Sequence

from frtrace.load import cupti
from frtrace.load.safe_decode import DecodeError, RawDump, RawValue
from frtrace.model import SHAPE_FIELDS, UNREADABLE_OP, Entry, Frame, OpName, PgConfig, PgStatus, Shapes
from frtrace.table.batches import (
    batch_numbering,
    batching_groups,
    finished_settlements,
    lone_ops_of_finished_batches,
    p2p_batch_groups,
    settle_table_batches,
)
from frtrace.table.entry_columns import (
    SPLIT_FIELDS,
    Columns,
    SharedValues,
    columns_from_entries,
    columns_from_raw,
    entry_table,
    split_key,
    typed_as_validated,
)
from frtrace.table.entry_table import EntryTable
from frtrace.table.rank_dump import RankDump
from frtrace.table.standing import keeps_only_active, only_active_job

# A ring buffer keeps 2,000 entries by default (TORCH_NCCL_TRACE_BUFFER_SIZE); jobs that
# raise it use 20,000 or so. A file holding more is refused before normalising: 8 KB of
# pickle memo references can name one entry four million times, and each becomes an
# Entry of its own (3 GB, 73 s before this limit).
DEFAULT_MAX_ENTRIES = 500_000
# A pickle can name one object many times for two bytes each (memo references): 1.2 KB of
# gzip held half a million copies of one entry (8.5 s, 619 MB, and a rank blamed). An entry
# torch writes takes 60 bytes or more (some 20 keys, each value at least a byte), and each
# entry is a dict of its own: a pickle holding more than one entry per
# MIN_PICKLE_BYTES_PER_ENTRY bytes, or one entry object twice, is not a dump.
MIN_PICKLE_BYTES_PER_ENTRY = 16
# Lists the entries share (a frames or sizes list named by every entry) would cost their
# length again for every entry that names them. Honest dumps hold under 0.1 list item per
# pickle byte (synthetic NCCL: 0.08); past this many, reading the file is refused.
MAX_ITEMS_PER_PICKLE_BYTE = 8
_FRAME_FIELDS = operator.itemgetter("name", "filename", "line")
_RECORD_ORDER = operator.attrgetter("record_id", "index")
# A stack as entries hold it; shape and stack tables are looked up both by the raw values
# (tuples of what the file holds) and by the validated record itself, which interns it.
Stack = tuple[Frame, ...]
_RawKey = tuple[RawValue, ...]
_P2P_NAME = re.compile(r"^(?P<op>send|recv)\s+(?P<a>-?\d+|\?)\s*(?P<arrow>->|<-)\s*(?P<b>-?\d+|\?)$")


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
# Where the lists an entry may share with others sit: in _ENTRY_FIELDS (process_group,
# sizes, dtypes, frames; the sizes), and in the rows of entry_columns._ROW_FIELDS.
_ENTRY_LIST_POSITIONS = (2, 8, 9, 10, 11, 19)
_ENTRY_SIZES_POSITIONS = (8, 10)
_ROW_LIST_POSITIONS = (0, 2, 3, 4, 5, 7)


class _Unreadable(Exception):
    """An entry field that matching depends on cannot be read: the entry is dropped."""


@dataclass(slots=True)
class BatchMemo:
    """What reading one file teaches about the next files of the same batch (a worker's
    batch, or an in-process load): stacks validated without a warning, which validating
    again would give alike and say nothing about (~40 µs each), shape records likewise
    (looked up by their raw key, and taken where the raw values are of the types that
    validate without a warning: ~8 µs each, a dozen or so a file), op names parsed from
    profiling names (a pure function of the string, never a warning: ~5 µs each, a dozen
    or so a file), and parsed rank lists (every rank lists the whole world: 6 ms to parse
    at 16,384 ranks)."""

    clean_stacks: dict[_RawKey, Stack] = field(default_factory=dict)
    clean_shapes: dict[_RawKey, Shapes] = field(default_factory=dict)
    op_names: dict[tuple[str, bool], OpName] = field(default_factory=dict)
    rank_lists: dict[str, Optional[tuple[int, ...]]] = field(default_factory=dict)


class _Normaliser:
    """Per-file interning tables (op names: per batch, see BatchMemo) and the warnings
    collected while normalising.

    The tables map raw values (as the file holds them) to validated, interned results,
    so the common entry costs a few dict lookups; only values not seen before are
    validated field by field.
    """

    def __init__(self, memo: Optional[BatchMemo] = None, budget: Optional[int] = None, pickled: bool = False) -> None:
        # `budget`: how many list items (in entries' lists, each time an entry names one)
        # reading this file may cost; None for no limit (JSON writes every item out)
        self.budget = budget
        self.repeats_unchecked = pickled  # see refuse_repeated_entries
        self.strings: dict[str, str] = {}
        self.groups: dict[_RawKey, tuple[str, str]] = {}
        memo = BatchMemo() if memo is None else memo
        self.names: dict[tuple[str, bool], OpName] = memo.op_names
        self.shapes: dict[Hashable, Shapes] = {}
        self.frames: dict[Frame, Frame] = {}
        self.stacks: dict[Hashable, Stack] = {}
        self.clean_stacks: dict[_RawKey, Stack] = memo.clean_stacks
        self.clean_shapes: dict[_RawKey, Shapes] = memo.clean_shapes
        self.rank_lists: dict[str, Optional[tuple[int, ...]]] = memo.rank_lists
        self.warnings: Counter[str] = Counter()
        self.warned = 0

    def warn(self, message: str) -> None:
        self.warnings[message] += 1
        self.warned += 1

    def spend(self, items: int) -> None:
        """Count `items` list items against the budget; DecodeError once it is spent."""
        if self.budget is None:
            return
        self.budget -= items
        if self.budget < 0:
            raise DecodeError("its entries name the same lists over and over (pickle memo references): reading "
                              f"them would take more than {MAX_ITEMS_PER_PICKLE_BYTE} list items per byte of the pickle")

    def refuse_repeated_entries(self, raw_entries: list[RawValue], in_order: bool = False) -> None:
        """DecodeError when the entries of a pickle name one entry object twice (pickle memo
        references; see _raw_entries). Called before anything is spent on the entries, once
        per file; entries whose record ids (ints) strictly increase (`in_order`) are distinct
        objects already, and the check costs nothing then."""
        if self.repeats_unchecked and not in_order:
            _refuse_repeated_entries(raw_entries)
        self.repeats_unchecked = False

    def spend_on_rows(self, rows: list[tuple[RawValue, ...]]) -> None:
        """Spend what reading the static fields of `rows` (tuples of entry_columns._ROW_FIELDS)
        costs: their lists' items."""
        if self.budget is None:
            return
        for position in _ROW_LIST_POSITIONS:
            self.spend(_items(map(operator.itemgetter(position), rows)))

    def spend_on_shapes(self, *sizes_columns: Sequence[RawValue]) -> None:
        """Spend the dimensions of the shapes in `sizes_columns` (lists of input or output
        sizes), before keys are made of them."""
        if self.budget is not None:
            for column in sizes_columns:
                self.spend(_items(chain.from_iterable(filter(_is_list, column))))

    def spend_on_entry(self, values: tuple[RawValue, ...]) -> None:
        """`spend_on_rows` for one entry's values (in _ENTRY_FIELDS order)."""
        if self.budget is None:
            return
        self.spend(_items(values[position] for position in _ENTRY_LIST_POSITIONS))
        self.spend(_items(chain.from_iterable(filter(_is_list, (values[p] for p in _ENTRY_SIZES_POSITIONS)))))

    def rank_list(self, value: RawValue) -> Optional[tuple[int, ...]]:
        if not isinstance(value, str):
            return _parse_rank_list(value)
        if value not in self.rank_lists:
            self.rank_lists[value] = _parse_rank_list(value)
        return self.rank_lists[value]

    def text(self, value: RawValue, field_name: str, default: str = "") -> str:
        if value is None:
            return default
        if not isinstance(value, str):
            # Never str() it: a shared-reference tuple can expand to billions of items.
            self.warn(f"{field_name} is not a string")
            return default
        return self.strings.setdefault(value, value)

    def integer(self, value: RawValue, field_name: str, default: Optional[int] = 0) -> Optional[int]:
        if type(value) is int and -_INT_LIMIT < value < _INT_LIMIT:
            return value
        if value is None:
            return default
        number = _as_integer(value)
        if number is None:
            self.warn(f"{field_name} is not an integer")
            return default
        return number

    def process_group(self, pg: RawValue, pg_id: RawValue) -> tuple[str, str]:
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

    def _validated_process_group(self, pg: RawValue, pg_id: RawValue) -> tuple[str, str]:
        if isinstance(pg, (list, tuple)) and len(pg) >= 1:
            name = self.text(pg[0], "process_group name")
            desc = self.text(pg[1], "process_group desc") if len(pg) > 1 else ""
            return name, desc
        if pg is not None:
            self.warn("process_group is not a (name, desc) pair")
        # Old dumps without process_group: the rank-local pg_id is the only handle left.
        number = self.integer(pg_id, "pg_id", None)
        return (str(number) if number is not None else "?"), ""

    def op_name(self, profiling_name: RawValue, is_p2p_flag: RawValue) -> OpName:
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

    def sizes(self, value: RawValue, field_name: str) -> Optional[tuple[tuple[int, ...], ...]]:
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(
            isinstance(shape, (list, tuple)) and all(type(d) is int and 0 <= d < _INT_LIMIT for d in shape) for shape in value
        ):
            return tuple(map(tuple, value))
        self.warn(f"{field_name} is not a list of shapes")
        return None

    def dtypes(self, value: RawValue, field_name: str, tensors: int = 1) -> Optional[tuple[str, ...]]:
        if value is None:
            return ()
        if isinstance(value, str):
            # One dtype name for every tensor of the side ("float32", as some writers put
            # it): unambiguous, so read as such; "" names none (an empty side).
            return (self.text(value, field_name),) * max(tensors, 1) if value else ()
        if isinstance(value, (list, tuple)) and all(isinstance(d, str) for d in value):
            return tuple(self.text(d, field_name) for d in value)
        self.warn(f"{field_name} is not a list of dtype names")
        return None

    def split_sizes(self, value: RawValue, field_name: str) -> tuple[int, ...]:
        """Element counts per peer (see Shapes); () when absent or unreadable (with a warning)."""
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(type(n) is int and 0 <= n < _INT_LIMIT for n in value):
            return tuple(value)
        self.warn(f"{field_name} is not a list of element counts")
        return ()

    def shape_record(self, input_sizes: RawValue, input_dtypes: RawValue, output_sizes: RawValue,
                     output_dtypes: RawValue, input_splits: RawValue = None, output_splits: RawValue = None) -> Shapes:
        key: Optional[_RawKey]
        try:  # most entries repeat a handful of shapes: look the raw values up first
            key = (tuple(map(tuple, input_sizes or ())), _dtype_key(input_dtypes),
                   tuple(map(tuple, output_sizes or ())), _dtype_key(output_dtypes))
            if input_splits is not None or output_splits is not None:
                key = (*key, split_key(input_splits), split_key(output_splits))
            cached = self.shapes.get(key)
        except TypeError:  # not iterable, or unhashable inside: validate the slow way
            key, cached = None, None
        if cached is not None:
            return cached
        clean = self.clean_shapes.get(key) if key is not None else None
        if clean is not None and typed_as_validated((input_sizes, output_sizes), (input_dtypes, output_dtypes),
                                                    (input_splits, output_splits)):
            # Equal raw values of the types validation passes: validating them would give
            # this record again, without a word (a bool or a float equals an int, and a dict
            # makes the key its keys make: those are validated).
            shapes = self.shapes[key] = self.shapes.setdefault(clean, clean)
            return shapes
        warned = self.warned
        sizes_in, sizes_out = self.sizes(input_sizes, "input_sizes"), self.sizes(output_sizes, "output_sizes")
        dtypes_in = self.dtypes(input_dtypes, "input_dtypes", len(sizes_in or ()))
        dtypes_out = self.dtypes(output_dtypes, "output_dtypes", len(sizes_out or ()))
        fields = (sizes_in, dtypes_in, sizes_out, dtypes_out)  # None where unreadable
        unread = tuple(name for name, value in zip(SHAPE_FIELDS, fields) if value is None)
        shapes = Shapes(sizes_in or (), dtypes_in or (), sizes_out or (), dtypes_out or (), not unread,
                        self.split_sizes(input_splits, "input_split_sizes"),
                        self.split_sizes(output_splits, "output_split_sizes"), unread)
        shapes = self.shapes.setdefault(shapes, shapes)
        if key is not None:
            self.shapes[key] = shapes
            if self.warned == warned:
                self.clean_shapes[key] = shapes
        return shapes

    def stack(self, value: RawValue) -> Stack:
        if not value:
            return ()
        try:  # a stack seen before, looked up by its raw (name, file, line)s
            key = tuple(map(_FRAME_FIELDS, value))
            cached = self.stacks.get(key)
        except (TypeError, KeyError):
            key, cached = None, None
        if cached is not None:
            return cached
        clean = self.clean_stacks.get(key) if key is not None else None
        # A bool or a float equals an int (True == 1): a stack that an earlier file of the
        # batch held clean with line 1 is validated again where this one says True, or what
        # a file is told would depend on which files shared its batch.
        if clean is not None and key is not None and not _BOOL_OR_FLOAT & set(map(type, chain.from_iterable(key))):
            self.stacks[key] = clean
            return clean
        warned = self.warned
        stack = self._validated_stack(value)
        if key is not None:
            self.stacks[key] = stack
            if self.warned == warned:
                self.clean_stacks[key] = stack
        return stack

    def _validated_stack(self, value: RawValue) -> Stack:
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


_BOOL_OR_FLOAT = {bool, float}


def _is_list(value: RawValue) -> bool:
    return isinstance(value, (list, tuple))


def _items(values: Iterable[RawValue]) -> int:
    """The summed length of the lists, tuples, dicts and strings among `values`."""
    values = list(filter(None, values))
    try:
        return sum(map(len, values))
    except TypeError:  # something without a length (a number where a list belongs)
        return sum(len(value) for value in values if isinstance(value, (list, tuple, dict, str)))




def _dtype_key(value: RawValue) -> object:
    # A bare dtype name stays a string: as a tuple of its letters it would look up a list
    # of one-letter names.
    return value if isinstance(value, str) else tuple(value or ())


def _as_integer(value: RawValue) -> Optional[int]:
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


def _optional_time(value: RawValue, norm: _Normaliser, field_name: str) -> Optional[int]:
    # JSON writes 0 where pickle writes None: both mean "not observed".
    return norm.integer(value, field_name, None) or None


def _optional_float(value: RawValue, norm: _Normaliser, field_name: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300:
        number = float(value)
        if number == number:  # not NaN
            return number
    norm.warn(f"{field_name} is not a number")
    return None


def _fast_entry(index: int, values: tuple[RawValue, ...], norm: _Normaliser) -> Optional[Entry]:
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


def _validated_entry(index: int, values: tuple[RawValue, ...], norm: _Normaliser) -> Entry:
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


def _parse_rank_list(value: RawValue) -> Optional[tuple[int, ...]]:
    """Sorted global ranks from `"[0, 1, 2]"` (or a list), None when unreadable or empty."""
    if isinstance(value, (list, tuple)):
        if not all(type(r) is int and 0 <= r < _INT_LIMIT for r in value):
            return None
        return tuple(sorted(set(value))) or None
    if isinstance(value, str):
        return _rank_list_text(value)
    return None


def _rank_list_text(text: str) -> Optional[tuple[int, ...]]:
    """`_rank_list_text_plain`, read the quick way when `text` is what c10d writes."""
    written = _as_str_writes_it(text)
    if written is None:
        return _rank_list_text_plain(text)
    return tuple(sorted(set(written))) or None


def _rank_list_text_plain(text: str) -> Optional[tuple[int, ...]]:
    """Sorted global ranks from a text such as `"[0, 1, 2]"` or `"(0,1)"`.

    A regular expression rather than ast.literal_eval: the default group of a large job
    lists every rank, and compiling that string costs more than the rest of the file.
    """
    match = _RANK_LIST.fullmatch(text)
    if match is None:
        return None
    numbers = match[1]
    if numbers and max(map(len, numbers.split(","))) > 25:
        return None
    ranks = list(map(int, numbers.split(","))) if numbers else []
    return tuple(sorted(set(ranks))) or None


# Ranks this large are not read the quick way: they take the general path's length rule.
_QUICK_RANKS_BELOW = 10**24


def _as_str_writes_it(text: str) -> Optional[list[int]]:
    """The ranks of `text` when it is exactly what str() writes for a list of ints (the
    way c10d writes every pg_config: "[0, 1, 2]"), else None for the general path.

    Read by the C JSON decoder and then checked to be that text to the byte, so the
    answer is the regular expression's: at 32,768 ranks this takes 4 ms where the
    plain twin takes 7, once per worker batch for the group that lists every rank."""
    if len(text) < 3 or text[0] != "[" or not text[1].isdigit() or "-" in text:
        return None
    try:
        ranks = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if type(ranks) is not list or list(map(type, ranks)).count(int) != len(ranks) or str(ranks) != text:
        return None
    return ranks if max(ranks) < _QUICK_RANKS_BELOW else None


def _pg_config(raw: RawValue, norm: _Normaliser) -> tuple[PgConfig, ...]:
    if not isinstance(raw, dict):
        if raw is not None:
            norm.warn("pg_config is not a dict")
        return ()
    configs = []
    for key, value in raw.items():
        if not isinstance(value, dict):
            norm.warn("a pg_config value is not a dict")
            continue
        if _is_list(value.get("ranks")):  # a list (not the usual string) may be shared by every group
            norm.spend(len(value["ranks"]))
        name = norm.text(value.get("name", key), "pg_config name")
        configs.append(PgConfig(name, norm.text(value.get("desc"), "pg_config desc"), norm.rank_list(value.get("ranks"))))
    return tuple(configs)


def _pg_status(raw: RawValue, norm: _Normaliser) -> dict[int, PgStatus]:
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


def _top_level_dict(raw: object) -> RawDump:
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


def _raw_entries(raw_entries: RawValue, max_entries: int = DEFAULT_MAX_ENTRIES,
                 pickle_bytes: Optional[int] = None) -> Optional[list[RawValue]]:
    """The `entries` list, None when the dump has none; DecodeError when it holds no entry
    at all, since such a rank would otherwise look like one that issued nothing, or more
    than `max_entries`, or (a pickle of `pickle_bytes`) more than its bytes can honestly
    hold: more than one entry per MIN_PICKLE_BYTES_PER_ENTRY, or one entry object twice
    (that is checked by `_Normaliser.refuse_repeated_entries` before any entry is read,
    unless the entries hold no dict at all)."""
    if raw_entries is None:
        return None
    if not isinstance(raw_entries, list):
        raise DecodeError(f"entries is a {type(raw_entries).__name__}, not a list")
    if len(raw_entries) > max_entries:
        raise DecodeError(f"holds {len(raw_entries):,} entries, over the limit of {max_entries:,} per file "
                          f"(a ring buffer keeps 2,000 by default)")
    if pickle_bytes is not None and len(raw_entries) * MIN_PICKLE_BYTES_PER_ENTRY > pickle_bytes:
        raise DecodeError(f"holds {len(raw_entries):,} entries in {pickle_bytes:,} bytes of pickle, more than one per "
                          f"{MIN_PICKLE_BYTES_PER_ENTRY} bytes (pickle memo references repeating entries?)")
    if raw_entries and not any(isinstance(item, dict) for item in raw_entries):
        if pickle_bytes is not None:
            _refuse_repeated_entries(raw_entries)
        raise DecodeError("entries holds no entry dicts")
    return raw_entries


def _refuse_repeated_entries(raw_entries: list[RawValue]) -> None:
    if len(set(map(id, raw_entries))) < len(raw_entries):
        raise DecodeError("names one entry more than once (pickle memo references): torch writes each entry once")


def _normalise_entries(raw_entries: list[RawValue], norm: _Normaliser, splits: bool = True) -> tuple[Columns, int]:
    """`(Columns of the entries sorted oldest first, number dropped as unreadable)`; the
    split sizes of format 2.11 are read only with `splits`."""
    columns = columns_from_raw(raw_entries, norm, splits)
    if columns is not None:
        return columns, 0
    norm.refuse_repeated_entries(raw_entries)
    entries, dropped = _entries_one_by_one(raw_entries, norm, splits)
    return columns_from_entries(entries), dropped


def _may_hold_splits(version: RawValue) -> bool:
    """Whether a dump of `version` may hold the split sizes of format 2.11 (looking for
    them costs a pass over every entry: not done where the version rules them out)."""
    major, _, minor = version.partition(".") if isinstance(version, str) else ("", "", "")
    if not (major.isdecimal() and minor.isdecimal()):
        return True
    return (int(major), int(minor)) >= (2, 11)


def _entries_one_by_one(raw_entries: list[RawValue], norm: _Normaliser,
                        splits: bool = True) -> tuple[tuple[Entry, ...], int]:
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
        norm.spend_on_entry(values)
        entry = _fast_entry(index, values, norm)
        if entry is None:
            try:
                entry = _validated_entry(index, values, norm)
            except _Unreadable as exc:
                norm.warn(f"an entry has no readable {exc} (dropped)")
                dropped += 1
                continue
        if splits and (SPLIT_FIELDS[0] in raw or SPLIT_FIELDS[1] in raw):
            entry = entry._replace(shapes=norm.shape_record(*values[8:12], *map(raw.get, SPLIT_FIELDS)))
        entries.append(entry)
    # Record ids order a rank's entries; ties (corrupt ids) keep file order.
    entries.sort(key=_RECORD_ORDER)
    return tuple(entries), dropped


def _version(raw: RawDump, norm: _Normaliser) -> str:
    version = raw.get("version")
    if isinstance(version, str):
        return version
    if version is not None:
        norm.warn("version is not a string")
    return "unknown"


def normalise_dump(raw: object, rank: int, path: str, encoding: str) -> RankDump:
    """Fold one decoded dump (any version) into a `RankDump`. Raises DecodeError when
    the data is not shaped like a dump at all."""
    dump, columns = normalised_without_entries(raw, rank, path, encoding)
    set_entries(dump, columns)
    return dump


def set_entries(dump: RankDump, columns: Columns, shared: Optional[SharedValues] = None) -> None:
    """The dump's entries from `columns`, as an `EntryTable`: each coalesced batch settled
    as one unit, and in a dump of only active entries, those its pg_status says finished
    (see `batches`)."""
    table = entry_table(columns)
    if shared is not None:
        table.share(shared)
    if settle_table_batches(table):
        table.compact()
    dump.entries = table
    if keeps_only_active(dump):
        _settle_finished(dump)


def _settle_finished(dump: RankDump) -> None:
    """Mark finished the ops of a dump of only active entries that its batches or its
    pg_status say finished (batches.finished_settlements)."""
    dump.entries.replace(finished_settlements(dump.entries, dump.pg_status))
    dump.entries.compact()


def settle_only_active_job(dumps: Sequence[RankDump]) -> list[RankDump]:
    """In a job dumped with only active entries (one dump's gaps in its record ids speak for
    every dump: `only_active_job`), settle the dumps whose few entries show no gap as
    `set_entries` settles those that do: a rank whose only unfinished ops are one batch's
    otherwise looks as if that batch never finished. Returns the dumps it settled."""
    if not only_active_job(dumps):
        return []
    settled = [dump for dump in dumps
               if dump.entries and dump.writer == cupti.C10D and not keeps_only_active(dump) and dump.backend != "gloo"]
    for dump in settled:
        _settle_finished(dump)
    _settle_lone_batch_ops(dumps)
    return settled


# Ranks whose batches say they take collective numbers of their own before the job is
# read so (one that says otherwise stops the reading: the torch build is the job's).
_RANKS_TO_SAY = 4


def count_collectives_apart_from_batches(dumps: list[RankDump]) -> list[RankDump]:
    """The dumps, where torch numbered the P2P batches as collectives (its
    `startCoalescing` bumps the collective counter: `batches.batch_numbering` says so for
    some ranks, and none says otherwise), with every entry of a group that posts batches
    renumbered by its collective number less its P2P number: what the group's collectives
    count apart from its batches, as other torch versions number them. A pipeline's stages
    post different numbers of batches, so by torch's own numbers one collective of the
    pipeline group is a different number on each stage. Such groups' pg_status rows, in
    torch's numbers, say nothing then. A renumbered dump is a new object (its group parts
    are dealt again)."""
    c10d = [dump for dump in dumps if dump.entries and dump.writer == cupti.C10D and dump.backend != "gloo"]
    said = 0
    for dump in c10d:
        own_numbers = batch_numbering(dump.entries)
        if own_numbers is False:
            return dumps
        said += bool(own_numbers)
        if said == _RANKS_TO_SAY:
            break
    if not said:
        return dumps
    groups = set().union(*(p2p_batch_groups(dump.entries) for dump in c10d))
    groups |= _groups_described_alike(dumps, groups)
    renumber = {id(dump) for dump in c10d}
    return [_counted_apart_from_batches(dump, groups) if id(dump) in renumber else dump for dump in dumps]


def _counted_apart_from_batches(dump: RankDump, groups: set[str]) -> RankDump:
    entries = dump.entries
    rows = [row for row, _ in entries.rows_where(lambda static: static.pg_name if static.pg_name in groups else None)]
    if not rows:
        return dump
    numbers, p2p_numbers = entries.field_at("collective_seq_id", rows), entries.field_at("p2p_seq_id", rows)
    entries.set_field(rows, "collective_seq_id",
                      [number - p2p if type(number) is int and type(p2p) is int else number
                       for number, p2p in zip(numbers, p2p_numbers)])
    pg_ids = set(entries.field_at("pg_id", rows))
    unknown = PgStatus(None, None, None)
    status = {pg_id: unknown if pg_id in pg_ids else row for pg_id, row in dump.pg_status.items()}
    return dataclasses.replace(dump, pg_status=status)


def _settle_lone_batch_ops(dumps: Sequence[RankDump]) -> None:
    """In a job of only active entries, mark finished each rank's batches of one op that
    finished (`batches.lone_ops_of_finished_batches`), in the groups where some rank shows
    it posts its P2P work in batches: one rank's batch of one op looks like a plain op,
    but the ranks of a group post alike (batch_isend_irecv or not)."""
    c10d = [dump for dump in dumps if dump.entries and dump.writer == cupti.C10D and dump.backend != "gloo"]
    batching = set().union(*(batching_groups(dump.entries) for dump in c10d))
    if not batching:
        return
    batching |= _groups_described_alike(dumps, batching)
    for dump in c10d:
        entries = dump.entries
        rows = lone_ops_of_finished_batches(entries, batching, dump.pg_status)
        if rows:
            entries.replace({row: entries[row]._replace(retired=True) for row in rows})
            entries.compact()


def _groups_described_alike(dumps: Sequence[RankDump], groups: set[str]) -> set[str]:
    """The groups whose description (`pg_desc`) is that of one of `groups`: the pipeline
    groups of one job post their sends and recvs alike, and a group whose only dump that
    shows its batches is missing (the other end posts batches of one op) is still read
    so. Groups without a description of their own (none, or torch's "undefined") are
    left out."""
    descs: dict[str, set[str]] = {}
    for dump in dumps:
        for config in dump.pg_config:
            if config.desc and config.desc != "undefined":
                descs.setdefault(config.desc, set()).add(config.name)
    return {name for names in descs.values() if names & groups for name in names}


def normalised_without_entries(raw: object, rank: int, path: str, encoding: str, memo: Optional[BatchMemo] = None,
                               max_entries: int = DEFAULT_MAX_ENTRIES,
                               pickle_bytes: Optional[int] = None) -> tuple[RankDump, Columns]:
    """`(RankDump without its entries, Columns of its entries)`. `pickle_bytes`: the size of
    the pickle `raw` was decoded from, which bounds what it may hold (see _raw_entries and
    _Normaliser.spend); None for JSON."""
    raw = _top_level_dict(raw)
    writer, clock, clipped = cupti.C10D, cupti.WALL_CLOCK, None
    if cupti.is_monitor_dump(raw):
        raw, clock, clipped = cupti.as_c10d(raw)
        writer = cupti.WRITER
    raw_entries = _raw_entries(raw.get("entries"), max_entries, pickle_bytes)
    norm = _Normaliser(memo, None if pickle_bytes is None else MAX_ITEMS_PER_PICKLE_BYTE * pickle_bytes,
                       pickled=pickle_bytes is not None)
    comm_lib = raw.get("comm_lib_version", raw.get("nccl_version", raw.get("xccl_version", "")))
    columns, dropped = _normalise_entries(raw_entries or [], norm, _may_hold_splits(raw.get("version")))
    dump = RankDump(
        rank=rank,
        path=path,
        encoding=encoding,
        version=_version(raw, norm),
        comm_lib_version=norm.text(comm_lib, "comm_lib_version"),
        pg_config=_pg_config(raw.get("pg_config"), norm),
        pg_status=_pg_status(raw.get("pg_status"), norm),
        entries=EntryTable.from_entries(()),
        # JSON dumps omit `entries` when it is empty; only pickles tell "no collectives" apart.
        has_entries=raw_entries is not None or encoding.startswith("json"),
        unreadable_entries=dropped,
        writer=writer,
        clock=clock,
        window_clipped=clipped,
    )
    dump.warnings = tuple(f"{msg} ({n}x)" if n > 1 else msg for msg, n in sorted(norm.warnings.items()))
    return dump, columns


PLAIN_TWINS = {"_rank_list_text": _rank_list_text_plain}
