"""Entries a column at a time: the loader's fast path and its compact form between processes.

Takes the raw entry dicts of one decoded dump (and the loader's per-file `_Normaliser`);
returns `Columns`, one list per `Entry` field in `ENTRY_FIELDS` order, or None when
any field holds something other than what torch writes, in which case the loader goes
entry by entry and says what it found. Also packs columns into arrays for the trip
from a loader worker to the parent, and turns columns into `Entry` tuples.

Why columns: a 4,096-rank job holds eight million entries. Checking each field's type
and range, and looking up interned values, one entry at a time in Python costs several
microseconds per entry; done over a whole column with `map`, `set` and `min`/`max`, the
same checks run in C. Sending columns as `array`s costs the worker and the parent almost
nothing, where a tuple per entry costs both a pickle round trip.
"""

from __future__ import annotations

import math
import operator
from array import array
from itertools import count, repeat
from typing import NamedTuple, Optional, Sequence

from .model import Entry

INT_LIMIT = 2**64  # a wider integer is not a value torch writes: the slow path warns about it
_NONE = type(None)
_INTS = {int}
_OPTIONAL_INTS = {int, _NONE}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ABSENT = _INT64_MIN  # stands for None in a packed optional-integer column; never a real value
_new_entry = tuple.__new__

# Raw fields the fast path reads, and which of them must hold integers (or None as well).
_RAW_FIELDS = (
    "record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "is_p2p",
    "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state", "retired", "time_created_ns",
    "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms", "timeout_ms", "frames",
)
_INT_FIELDS = ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")
_OPTIONAL_INT_FIELDS = ("time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms")
# Entry fields whose ints repeat across entries and ranks (index, record_id, pg_id, the two
# sequence numbers, op_id), and those holding interned values (group name and description,
# op name, shapes, state, stack): see SharedValues.
_SHAREABLE_INTS = (0, 1, 4, 5, 6, 7)
_SHAREABLE_VALUES = (2, 3, 8, 9, 10, 17)
_SMALL_INT_LIMIT = 1 << 16


class Columns(NamedTuple):
    """Every Entry field as one list, in Entry order; all lists have the same length."""

    lists: list


def _field(raw_entries: list, name: str) -> list:
    return list(map(dict.get, raw_entries, repeat(name)))


def _fields(raw_entries: list, names: tuple) -> dict:
    """name -> column of that field (None where an entry lacks it)."""
    first, last = raw_entries[0], raw_entries[-1]
    # One itemgetter pass over the entries touches each dict once; a pass per field would
    # touch it twenty times. Fields that only some entries carry (duration_ms: completed,
    # timed entries only) are read one by one.
    common = tuple(name for name in names if name in first and name in last)
    columns = {}
    if len(common) > 1:
        try:
            columns = dict(zip(common, zip(*map(operator.itemgetter(*common), raw_entries))))
        except KeyError:  # not even those are in every entry
            columns = {}
    for name in names:
        if name not in columns:
            columns[name] = _field(raw_entries, name)
    return columns


def _ints(column: list, optional: bool = False) -> bool:
    """Every value an int within INT_LIMIT (or None, when optional)."""
    kinds = set(map(type, column))
    if not kinds <= (_OPTIONAL_INTS if optional else _INTS):
        return False
    values = list(filter(None, column)) if _NONE in kinds else column
    return not values or (-INT_LIMIT < min(values) and max(values) < INT_LIMIT)


def _zero_means_none(column: list) -> list:
    # JSON writes 0 where pickle writes None: both mean "not observed".
    return [value or None for value in column] if 0 in column else column


def _floats(column: list) -> bool:
    kinds = set(map(type, column))
    if not kinds <= {float, _NONE}:
        return False
    present = [value for value in column if value is not None] if _NONE in kinds else column
    return all(map(math.isfinite, present)) and (not present or max(map(abs, present)) < 1e300)


def _interned(keys: Sequence, table: dict, make) -> Optional[list]:
    """`table[key]` for every key; `make(key, position of its first entry)` fills in keys
    not in the table yet. None when a key cannot be hashed.

    Keys can be deep tuples, and tuples do not keep their hash: each is hashed once here
    (to find its first entry), and the rest goes by that position."""
    first_at: dict = {}
    try:
        positions = list(map(first_at.setdefault, keys, count()))
    except TypeError:  # unhashable inside
        return None
    value_at = {}
    for key, position in first_at.items():
        value = table.get(key)
        if value is None:
            value = table[key] = make(key, position)
        value_at[position] = value
    return list(map(value_at.__getitem__, positions))


def _groups(fields: dict, norm) -> Optional[tuple]:
    pgs = fields["process_group"]
    kinds = set(map(type, pgs))
    if kinds == {list}:  # JSON writes the (name, desc) pair as a list
        pgs = list(map(tuple, pgs))
    elif kinds != {tuple}:
        return None
    if () in pgs:
        return None  # an empty pair falls back on pg_id, which only that path reads
    groups = _interned(pgs, norm.groups, lambda pg, _: norm._validated_process_group(pg, None))
    if groups is None:
        return None
    return list(map(operator.itemgetter(0), groups)), list(map(operator.itemgetter(1), groups))


def _op_names(fields: dict, norm) -> Optional[list]:
    names, flags = fields["profiling_name"], fields["is_p2p"]
    if set(map(type, names)) != {str} or not set(map(type, flags)) <= {bool, _NONE}:
        return None
    keys = list(zip(names, map(operator.is_, flags, repeat(True))))
    return _interned(keys, norm.names, lambda key, _: norm.op_name(*key))


def _states(fields: dict, norm) -> Optional[list]:
    states = fields["state"]
    if set(map(type, states)) != {str}:
        return None
    return _interned(states, norm.strings, lambda state, _: state)


def _shape_keys(sizes: list, dtypes: list) -> tuple:
    return map(tuple, map(map, repeat(tuple), sizes)), map(tuple, dtypes)


def _shapes(fields: dict, norm) -> Optional[list]:
    raw = [fields[name] for name in ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")]
    if any(set(map(type, column)) != {list} for column in raw):
        return None
    try:
        in_sizes, in_dtypes = _shape_keys(raw[0], raw[1])
        out_sizes, out_dtypes = _shape_keys(raw[2], raw[3])
        keys = list(zip(in_sizes, in_dtypes, out_sizes, out_dtypes))
    except TypeError:  # a shape that is not a list
        return None
    # Validate the raw values of each key's first entry, as the entry-by-entry path does.
    return _interned(keys, norm.shapes, lambda _, at: norm.shape_record(*(column[at] for column in raw)))


def _stacks(fields: dict, norm) -> Optional[list]:
    frames = fields["frames"]
    kinds = set(map(type, frames))
    if kinds == {_NONE}:  # dumped without stacks
        return [()] * len(frames)
    if kinds != {list}:
        return None
    # torch's pickler writes one dict per distinct frame and refers back to it, so a stack is
    # known by the identities of its frame dicts (alive, hence unique, while `frames` is).
    # Stacks with fresh dicts (JSON) are simply each looked up by value once.
    try:
        keys = list(map(tuple, map(map, repeat(id), frames)))
    except TypeError:
        return None
    return _interned(keys, {}, lambda _, at: norm.stack(frames[at]))


def columns_from_raw(raw_entries: list, norm) -> Optional[Columns]:
    """The entries of one dump as columns, oldest first, checked and interned exactly as the
    entry-by-entry path would; None when anything is unusual (that path then handles it)."""
    if not raw_entries or set(map(type, raw_entries)) != {dict}:
        return None
    fields = _fields(raw_entries, _RAW_FIELDS)
    if not (all(_ints(fields[name]) for name in _INT_FIELDS)
            and all(_ints(fields[name], optional=True) for name in _OPTIONAL_INT_FIELDS)
            and set(map(type, fields["retired"])) <= {bool, _NONE} and _floats(fields["duration_ms"])):
        return None
    groups = _groups(fields, norm)
    names = _op_names(fields, norm) if groups else None
    shapes = _shapes(fields, norm) if names else None
    states = _states(fields, norm) if shapes else None
    stacks = _stacks(fields, norm) if states else None
    if stacks is None:
        return None
    record_ids = fields["record_id"]
    columns = [
        range(len(raw_entries)), record_ids, groups[0], groups[1], fields["pg_id"],
        fields["collective_seq_id"], fields["p2p_seq_id"], fields["op_id"], names, shapes, states,
        fields["retired"], fields["time_created_ns"], _zero_means_none(fields["time_discovered_started_ns"]),
        _zero_means_none(fields["time_discovered_completed_ns"]), fields["duration_ms"], fields["timeout_ms"], stacks,
    ]
    if not all(map(operator.lt, record_ids, record_ids[1:])):
        # Record ids order a rank's entries; ties (corrupt ids) keep file order.
        order = sorted(range(len(record_ids)), key=record_ids.__getitem__)
        columns = [list(map(column.__getitem__, order)) for column in columns]
    return Columns(columns)


def columns_from_entries(entries: Sequence[Entry]) -> Columns:
    return Columns([list(column) for column in zip(*entries)] if entries else [[] for _ in Entry._fields])


class SharedValues:
    """Objects the entries of every rank share, for one load: the ints below 65,536, and
    one copy of each distinct group name, op name, shape record, state and stack.

    Each file's values are interned while it is read, but files are read apart (often in
    other processes), so without this every rank would hold copies of the same stacks,
    and the matcher could not tell equal ops apart by identity."""

    __slots__ = ("ints", "values")

    def __init__(self) -> None:
        self.ints = tuple(range(_SMALL_INT_LIMIT))
        self.values: dict = {}

    def one_of(self, value):
        return self.values.setdefault(value, value)

    def ints_of(self, column: Sequence[int]) -> Sequence[int]:
        """The column with its ints replaced by the shared objects, when all are small enough:
        sequence numbers and record ids repeat across entries and ranks, and each int of
        its own would cost 28 bytes."""
        if not column or min(column) < 0 or max(column) >= _SMALL_INT_LIMIT:
            return column
        return list(map(self.ints.__getitem__, column))

    def values_of(self, column: Sequence) -> Sequence:
        """The column with each value replaced by the shared copy; the column holds few distinct
        objects (they are interned per file), so only those are looked up by value."""
        distinct = dict(zip(map(id, column), column))
        swap = {key: self.one_of(value) for key, value in distinct.items()}
        if all(swap[key] is value for key, value in distinct.items()):
            return column
        return list(map(swap.__getitem__, map(id, column)))


def entries_from_columns(columns: Columns, shared: Optional[SharedValues] = None) -> tuple:
    """An Entry per row of `columns`; with `shared`, repeating values are shared objects."""
    lists = list(columns.lists)
    if shared is not None:
        for position in _SHAREABLE_INTS:
            lists[position] = shared.ints_of(lists[position])
        for position in _SHAREABLE_VALUES:
            lists[position] = shared.values_of(lists[position])
    return tuple(map(_new_entry, repeat(Entry), zip(*lists)))


# --------------------------------------------------------------------------- transfer


def _pack(column: list):
    kinds = set(map(type, column))
    if column and kinds <= _OPTIONAL_INTS and _INTS <= kinds:
        present = [value for value in column if value is not None] if _NONE in kinds else column
        low, high = min(present), max(present)
        if _NONE not in kinds and 0 <= low and high <= 0xFFFF:
            return "H", array("H", column)  # the parent can share these ints (see `shared_ints`)
        if _INT64_MIN < low and high <= _INT64_MAX:
            if _NONE in kinds:
                return "q?", array("q", [_ABSENT if value is None else value for value in column])
            return "q", array("q", column)
    # Few distinct values (interned strings, shapes, stacks): a table and one code per entry.
    # Types do not mix within a column here, so equal keys (1 == 1.0 == True) cannot merge.
    table = list(dict.fromkeys(column))
    code_of = {value: code for code, value in enumerate(table)}
    return "t", table, array("I", map(code_of.__getitem__, column))


def _unpack(packed, position: int, shared: Optional[SharedValues]) -> Sequence:
    kind = packed[0]
    if kind == "H":
        return packed[1] if shared is None else list(map(shared.ints.__getitem__, packed[1]))
    if kind == "q":
        return packed[1]  # an array reads as ints
    if kind == "q?":
        return [None if value == _ABSENT else value for value in packed[1].tolist()]
    table, codes = packed[1], packed[2]
    if shared is not None and position in _SHAREABLE_VALUES:
        table = list(map(shared.one_of, table))
    if len(table) == 1:  # a field every entry has the same value in (often None)
        return table * len(codes)
    return list(map(table.__getitem__, codes))


def pack(columns: Columns) -> tuple:
    """A form of `columns` that pickles fast and small: arrays of ints, and tables of distinct
    values with array codes."""
    return tuple(map(_pack, columns.lists))


def unpack(packed: tuple, shared: Optional[SharedValues] = None) -> Columns:
    """The columns `pack` packed, their repeating values taken from `shared`."""
    return Columns([_unpack(column, position, shared) for position, column in enumerate(packed)])
