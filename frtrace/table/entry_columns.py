"""Entries a column at a time: the loader's fast path.

Takes the raw entry dicts of one decoded dump (and the loader's per-file `_Normaliser`);
returns `Columns`, one column per `Entry` field, or None when any field holds something
other than what torch writes, in which case the loader goes entry by entry and says what
it found. Also turns columns into the `EntryTable` the loader keeps (`entry_table`), or
into `Entry` tuples, sharing equal values across ranks (`SharedValues`).

Why: a 4,096-rank job holds eight million entries. Checked one entry at a time in
Python, each costs several microseconds. Here the checks run over whole columns in C
(`map`, `set`, `array`), and an entry's static part (group, op, shapes, state, stack),
which nearly always repeats an earlier entry's, is compared with that entry in C and
only interned where it is new.
"""

from __future__ import annotations

import itertools
import math
import operator
import struct
from array import array
from itertools import count, repeat
from typing import Any, Callable, Iterable, NamedTuple, Optional, Protocol, Sequence, TypeVar

from frtrace.model import SHAPE_FIELDS, Entry, Frame, OpName, Shapes
from frtrace.table.entry_table import INT_RANGES, STATIC_FIELDS, EntryTable, Value

_NONE = type(None)
# One raw entry of a decoded dump, and one column of values (see Columns).
RawEntry = dict[str, Any]
Column = Sequence[Value]
_Interned = TypeVar("_Interned")

# Raw fields the fast path reads a column at a time, and which of them must hold integers
# (or None as well).
_COLUMN_FIELDS = (
    "record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "is_p2p", "retired",
    "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms", "timeout_ms",
)
_INT_FIELDS = ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")
_OPTIONAL_INT_FIELDS = ("time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms")
# Raw fields that make up an entry's static part besides its op name, the same for most
# entries of one op in one group: read as one row (a tuple) per entry, compared whole.
_ROW_FIELDS = ("process_group", "is_p2p", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state",
               "frames")
# Raw fields of dump format 2.11 (an all_to_all's element counts per peer), read with the
# static part when a dump holds them.
SPLIT_FIELDS = ("input_split_sizes", "output_split_sizes")
# The Entry fields an EntryTable codes together (group name and description, op name,
# shapes, state, stack), which every rank shares (see SharedValues).
_STATIC_POSITIONS = tuple(Entry._fields.index(f) for f in STATIC_FIELDS)
_EXAMPLE_ROUNDS = 6  # see _examples
# Int array widths, narrowest first, each with its lowest value (kept for None), packed.
_WIDTHS = tuple((typecode, struct.pack(typecode, low)) for typecode, (low, _) in INT_RANGES.items())


class Coded(NamedTuple):
    """A column of few distinct values: entry i holds `table[codes[i]]`."""

    table: Sequence[Value]
    codes: Sequence[int]

    def values(self) -> list[Value]:
        return list(map(self.table.__getitem__, self.codes))


class Columns(NamedTuple):
    """Every Entry field as one column, in Entry order; all columns have the same length.
    A column is a sequence of values, or `Coded`."""

    lists: list[Column | Coded]


class Normaliser(Protocol):
    """What the fast path asks of the loader's per-file normaliser (load/normalise.py):
    its interning tables, and the checks the entry-by-entry path runs on a value."""

    groups: dict[Any, tuple[str, str]]
    names: dict[Any, OpName]
    shapes: dict[Any, Shapes]
    clean_shapes: dict[Any, Shapes]
    strings: dict[Any, str]

    def _validated_process_group(self, pg: Any, pg_id: Optional[int]) -> tuple[str, str]: ...

    def op_name(self, profiling_name: Any, is_p2p_flag: Any) -> OpName: ...

    def shape_record(self, input_sizes: Any, input_dtypes: Any, output_sizes: Any, output_dtypes: Any) -> Shapes: ...

    def stack(self, value: Any) -> tuple[Frame, ...]: ...

    def refuse_repeated_entries(self, raw_entries: list[RawEntry], in_order: bool) -> None: ...

    def spend_on_rows(self, rows: list[tuple[Any, ...]]) -> None: ...

    def spend_on_shapes(self, *sizes_columns: Sequence[Any]) -> None: ...


def _field(raw_entries: list[RawEntry], key: str) -> list[Value]:
    return list(map(dict.get, raw_entries, repeat(key)))


def _keys_held(raw_entries: list[RawEntry], names: tuple[str, ...]) -> dict[str, str]:
    """name -> the key object the dump itself holds for it, for those of `names` that the
    first and the last entry hold (so most likely every entry).

    A dict compares a key by identity before it compares characters, and the entries of a
    decoded dump share their key objects (pickle writes each key once and refers back to
    it; json's decoder keeps one of each): looked up by those, a field costs a fifth less."""
    first, last = raw_entries[0], raw_entries[-1]
    held = dict(zip(first, first))
    return {name: held[name] for name in names if name in held and name in last}


def _fields(raw_entries: list[RawEntry], names: tuple[str, ...]) -> dict[str, Column]:
    """name -> column of that field (None where an entry lacks it)."""
    # One itemgetter pass over the entries touches each dict once; a pass per field would
    # touch it thirteen times. Fields that only some entries carry (duration_ms: completed,
    # timed entries only) are read one by one.
    keys = _keys_held(raw_entries, names)
    columns: dict[str, Column] = {}
    if len(keys) > 1:
        try:
            columns = dict(zip(keys, zip(*map(operator.itemgetter(*keys.values()), raw_entries))))
        except KeyError:  # not even those are in every entry
            columns = {}
    for name in names:
        if name not in columns:
            columns[name] = _field(raw_entries, keys.get(name, name))
    return columns


def _rows(raw_entries: list[RawEntry], names: tuple[str, ...]) -> list[tuple[Value, ...]]:
    """A tuple per entry of the fields `names` (None where an entry lacks one)."""
    # The static fields are compared a row at a time (see _examples): an itemgetter makes
    # those rows directly, where columns would have to be zipped back into rows.
    keys = _keys_held(raw_entries, names)
    if len(keys) == len(names) > 1:
        try:
            return list(map(operator.itemgetter(*keys.values()), raw_entries))
        except KeyError:  # some entry in between lacks one
            pass
    return list(zip(*(_field(raw_entries, keys.get(name, name)) for name in names)))


def _int_column(column: Column) -> "Optional[array[int]]":
    """The column in the narrowest int array that holds it and one value below it (see
    EntryTable), or None when a value is not an int as torch writes it (a bool, a float, a
    number past 64 bits).

    Passes in C: the types (bools and int subclasses are not `int`), then a conversion
    per width, narrowest first, which stops at the first value that does not fit (its own
    bounds check: no min and max first); the table keeps the array as it is. `struct`
    packs ints twice as fast as `array` converts them, and the packed bytes are searched
    for the lowest value faster than the ints are compared with it."""
    if list(map(type, column)).count(int) != len(column):  # a list counts faster than a set grows
        return None
    for typecode, lowest in _WIDTHS:
        try:
            packed = struct.pack(f"{len(column)}{typecode}", *column)
        except (struct.error, OverflowError):
            continue
        if not _holds_item(packed, lowest):
            return array(typecode, packed)
    # Only int64's lowest value itself gets here, which the others keep for None: kept as is.
    try:
        return array("q", column)
    except OverflowError:
        return None


def _holds_item(packed: bytes, item: bytes) -> bool:
    """Whether `packed` (items of len(item) bytes each) holds `item` as one of its items."""
    at = packed.find(item)
    while at >= 0 and at % len(item):  # found across two items
        at = packed.find(item, at + 1)
    return at >= 0


def _optional_int_column(column: Column) -> Optional[Sequence[Optional[int]]]:
    """`_int_column` of a field that may be None: the column itself when some values are."""
    if column[0] is not None:  # ints throughout, as a rule (timeout_ms)
        ints = _int_column(column)
        if ints is not None:
            return ints
    if _all_none(column):  # never observed (timing off): nothing to check
        return column
    if not set(map(type, column)) <= {int, _NONE}:
        return None
    try:
        array("q", filter(None, column))  # skips the Nones (and zeros, which fit anyway)
    except OverflowError:
        return None
    return column


def _all_none(column: Column) -> bool:
    # Counting Nones finds them by identity: quicker than any check of their type or value
    # (`0 in column` compares each None with 0).
    return column[0] is None and column.count(None) == len(column)


def _zero_means_none(column: Column) -> Column:
    # JSON writes 0 where pickle writes None: both mean "not observed".
    if _all_none(column) or 0 not in column:
        return column
    return [value or None for value in column]


def _bools(column: Column) -> bool:
    """Every value a bool or None (a list counts types faster than a set grows)."""
    kinds = list(map(type, column))
    return kinds.count(bool) + kinds.count(_NONE) == len(kinds)


def _floats(column: Column) -> bool:
    if _all_none(column):  # no durations (timing off)
        return True
    kinds = set(map(type, column))
    if not kinds <= {float, _NONE}:
        return False
    present = [value for value in column if value is not None] if _NONE in kinds else column
    return all(map(math.isfinite, present)) and (not present or max(map(abs, present)) < 1e300)


def _interned(keys: Sequence[Any], table: dict[Any, _Interned], make: Callable[[Any, int], _Interned]) -> Optional[list[_Interned]]:
    """`table[key]` for every key; `make(key, position of its first entry)` fills in keys
    not in the table yet. None when a key cannot be hashed.

    Keys can be deep tuples, and tuples do not keep their hash: each is hashed once here
    (to find its first entry), and the rest goes by that position."""
    first_at: dict[Any, int] = {}
    try:
        positions = list(map(first_at.setdefault, keys, count()))
    except TypeError:  # unhashable inside
        return None
    value_at: dict[int, _Interned] = {}
    for key, position in first_at.items():
        value = table.get(key)
        if value is None:
            value = table[key] = make(key, position)
        value_at[position] = value
    return list(map(value_at.__getitem__, positions))


def _groups(fields: dict[str, Column], norm: Normaliser) -> Optional[tuple[list[str], list[str]]]:
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


def _op_names(fields: dict[str, Column], norm: Normaliser) -> Optional[list[OpName]]:
    names, flags = fields["profiling_name"], fields["is_p2p"]
    if set(map(type, names)) != {str} or not set(map(type, flags)) <= {bool, _NONE}:
        return None
    keys = list(zip(names, map(operator.is_, flags, repeat(True))))
    return _interned(keys, norm.names, lambda key, _: norm.op_name(*key))


def _states(fields: dict[str, Column], norm: Normaliser) -> Optional[list[str]]:
    states = fields["state"]
    if set(map(type, states)) != {str}:
        return None
    return _interned(states, norm.strings, lambda state, _: state)


def _examples(owners: Sequence[Any], rows: Sequence[tuple[Value, ...]]) -> Optional[tuple[list[int], list[int]]]:
    """`(example_of, needed)`: for every row, the position of an earlier (or its own) row
    equal to it; and, in ascending order, the positions that are their own example.

    The entries of one op in one group mostly repeat the same group, shapes, state and stack.
    Each row is compared (in C: `==` on the raw values) with an example, the first row of the
    same owner (op name and pg_id); rows unlike their example try again among themselves,
    for a few rounds. The first entry holding any value is always its own example, so
    interning just the `needed` rows, in order, validates the same raw values the
    entry-by-entry path would.
    """
    first_at: dict[Any, int] = {}
    try:
        example_of = list(map(first_at.setdefault, owners, count()))
        # The rows unlike the first of their owner, a few in most dumps.
        todo = list(itertools.compress(count(), map(operator.ne, rows, map(rows.__getitem__, example_of))))
    except Exception:  # noqa: BLE001 - unhashable or hostile values; the slow path judges them
        return None
    needed = set(first_at.values())
    if not todo:  # as a rule
        return example_of, sorted(needed)
    # A round each, in which the first of them (of each owner) is the example of the rest.
    for _round in range(1, _EXAMPLE_ROUNDS):
        if len(todo) * 16 < len(rows):
            break
        first_at = {}
        try:
            examples = list(map(first_at.setdefault, map(owners.__getitem__, todo), todo))
            alike = list(map(operator.eq, map(rows.__getitem__, todo), map(rows.__getitem__, examples)))
        except Exception:  # noqa: BLE001 - as above
            return None
        needed.update(first_at.values())
        for position, example in itertools.compress(zip(todo, examples), alike):
            example_of[position] = example
        todo = list(itertools.compress(todo, map(operator.not_, alike)))
    for position in todo:  # left over: their own example
        example_of[position] = position
    needed.update(todo)
    return example_of, sorted(needed)


def _shapes(fields: dict[str, Column], norm: Normaliser) -> Optional[list[Shapes]]:
    raw = [fields[name] for name in SHAPE_FIELDS]
    if str in set(map(type, raw[1])) or str in set(map(type, raw[3])):
        return None  # a bare dtype name, which the entry-by-entry path reads
    norm.spend_on_shapes(raw[0], raw[2])  # a shape the entries share costs its length each time
    # No type check first: a value that is not a list of lists either fails to make a key
    # (TypeError: the slow path takes the dump) or makes the key the entry-by-entry path
    # would make of it too, and is validated the same way.
    try:
        keys: list[tuple[Any, ...]] = list(zip(map(tuple, map(map, repeat(tuple), raw[0])), map(tuple, raw[1]),
                                     map(tuple, map(map, repeat(tuple), raw[2])), map(tuple, raw[3])))
    except TypeError:
        return None
    if SPLIT_FIELDS[0] in fields:  # dump format 2.11: an all_to_all's counts per peer are part of it
        raw += [fields[name] for name in SPLIT_FIELDS]
        try:
            keys = [(*key, split_key(a), split_key(b)) for key, a, b in zip(keys, raw[4], raw[5])]
        except TypeError:
            return None
    # Validate the raw values of each key's first entry, as the entry-by-entry path does,
    # or take the record validated for an equal key in an earlier file where the values
    # are all of the types that validate without a warning.
    sizes, dtypes, splits = itertools.chain(raw[0], raw[2]), itertools.chain(raw[1], raw[3]), itertools.chain(*raw[4:])
    known = norm.clean_shapes if typed_as_validated(sizes, dtypes, splits) else {}

    def make(key: Any, at: int) -> Shapes:
        shapes = known.get(key)
        if shapes is None:
            return norm.shape_record(*(column[at] for column in raw))
        return norm.shapes.setdefault(shapes, shapes)
    return _interned(keys, norm.shapes, make)


def typed_as_validated(sizes: Iterable[Any], dtypes: Iterable[Any], splits: Iterable[Any]) -> bool:
    """Whether shape values are all of the types the loader's `shape_record` validates
    without a warning: sizes lists (or tuples) of lists of ints, dtypes strings or lists,
    split sizes lists of ints, any of them None. Then a shape record validated before
    under an equal key (BatchMemo.clean_shapes) is what validating them would give: a bool
    or a float equals an int, and a dict makes the key its keys make, but these fail here.
    Checked in C, a set of types at a time."""
    sizes, splits = list(sizes), list(splits)
    return (set(map(type, sizes)) <= _LISTS_OR_NONE
            and set(map(type, itertools.chain.from_iterable(filter(None, sizes)))) <= _LISTS
            and set(map(type, itertools.chain.from_iterable(itertools.chain.from_iterable(filter(None, sizes))))) <= _INT
            and set(map(type, splits)) <= _LISTS_OR_NONE
            and set(map(type, itertools.chain.from_iterable(filter(None, splits)))) <= _INT
            and set(map(type, dtypes)) <= _DTYPES_OR_NONE)


_LISTS = {list, tuple}
_LISTS_OR_NONE = {list, tuple, _NONE}
_INT = {int}
_DTYPES_OR_NONE = {str, list, tuple, _NONE}


def split_key(value: Any) -> object:
    """The part of a shape record's key that an all_to_all's per-peer counts make (hashable)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _split_fields_held(raw_entries: list[RawEntry]) -> tuple[str, ...]:
    """SPLIT_FIELDS when some entry holds one of them (dump format 2.11), else ()."""
    if any(any(map(operator.contains, raw_entries, repeat(name))) for name in SPLIT_FIELDS):
        return SPLIT_FIELDS
    return ()


def _stacks(fields: dict[str, Column], norm: Normaliser) -> Optional[list[tuple[Frame, ...]]]:
    frames = fields["frames"]
    if frames[0] is None:  # dumped without stacks (the key is absent)
        return [()] * len(frames) if frames.count(None) == len(frames) else None
    # torch's pickler writes one dict per distinct frame and refers back to it, so a stack is
    # known by the identities of its frame dicts (alive, hence unique, while `frames` is).
    # Stacks of fresh dicts (JSON) are each looked up by value once. No type check first, as
    # for shapes: what is not a list fails to make a key or is validated as usual.
    try:
        keys = list(map(tuple, map(map, repeat(id), frames)))
    except TypeError:
        return None
    return _interned(keys, {}, lambda _, at: norm.stack(frames[at]))


def _static_columns(fields: dict[str, Column], rows: list[tuple[Value, ...]], norm: Normaliser,
                   row_fields: tuple[str, ...] = _ROW_FIELDS) -> Optional[list[Coded]]:
    """Coded columns for pg_name, pg_desc, name, shapes, state and frames, from the rows of
    `row_fields` (_ROW_FIELDS, and SPLIT_FIELDS when the dump holds them)."""
    # `is_p2p` is the one field where equal raw values are judged apart (1 == True, but only
    # True makes a P2P op): equality between rows is only trusted when it holds bools.
    if not _bools(fields["is_p2p"]):
        return None
    # The op name is part of what picks a row's example, so the two hold equal names already
    # (and only str names pass the check of the rows interned below).
    names = fields["profiling_name"]
    examples = _examples(list(zip(names, fields["pg_id"])), rows)
    if examples is None:
        return None
    example_of, needed = examples
    # Keys are made of the needed rows' lists: a list the entries share (pickle memo
    # references) costs its length for each (see _Normaliser.spend). Comparing rows above
    # costs no more than the pickle's bytes: a list is compared item by item only with
    # another list object, which the pickle holds too.
    norm.spend_on_rows(list(map(rows.__getitem__, needed)))
    chosen: dict[str, Column] = dict(zip(row_fields, zip(*map(rows.__getitem__, needed))))
    chosen["profiling_name"] = list(map(names.__getitem__, needed))
    groups = _groups(chosen, norm)
    op_names = _op_names(chosen, norm) if groups else None
    if groups is None:
        return None
    shapes = _shapes(chosen, norm) if op_names else None
    states = _states(chosen, norm) if shapes else None
    stacks = _stacks(chosen, norm) if states else None
    if op_names is None or shapes is None or states is None or stacks is None:
        return None
    # One list of codes for all six columns: code i stands for the i-th needed row's values.
    codes = list(map(dict(zip(needed, count())).__getitem__, example_of))
    return [Coded(values, codes) for values in (*groups, op_names, shapes, states, stacks)]


def columns_from_raw(raw_entries: list[RawEntry], norm: Normaliser, splits: bool = True) -> Optional[Columns]:
    """The entries of one dump as columns, oldest first, checked and interned exactly as the
    entry-by-entry path would; None when anything is unusual (that path then handles it).
    The split sizes of format 2.11 (SPLIT_FIELDS) are read only with `splits`."""
    if not raw_entries or list(map(type, raw_entries)).count(dict) != len(raw_entries):
        return None
    fields = _fields(raw_entries, _COLUMN_FIELDS)
    record_ids = fields["record_id"]  # as read: cheaper to compare than the array's values
    for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
        column = _int_column(fields[name]) if name in _INT_FIELDS else _optional_int_column(fields[name])
        if column is None:
            return None
        fields[name] = column
    # Strictly increasing ids (ints, as checked) are distinct, and so are the entries that
    # hold them; else a pickle naming one entry twice is refused before its rows are read.
    in_order = all(map(operator.lt, record_ids, record_ids[1:]))
    norm.refuse_repeated_entries(raw_entries, in_order)
    if not (_bools(fields["retired"]) and _floats(fields["duration_ms"])):
        return None
    row_fields = _ROW_FIELDS + (_split_fields_held(raw_entries) if splits else ())
    static = _static_columns(fields, _rows(raw_entries, row_fields), norm, row_fields)
    if static is None:
        return None
    pg_names, pg_descs, names, shapes, states, stacks = static
    columns: list[Column | Coded] = [
        range(len(raw_entries)), fields["record_id"], pg_names, pg_descs, fields["pg_id"],
        fields["collective_seq_id"], fields["p2p_seq_id"], fields["op_id"], names, shapes, states,
        fields["retired"], fields["time_created_ns"], _zero_means_none(fields["time_discovered_started_ns"]),
        _zero_means_none(fields["time_discovered_completed_ns"]), fields["duration_ms"], fields["timeout_ms"], stacks,
    ]
    if not in_order:
        # Record ids order a rank's entries; ties (corrupt ids) keep file order.
        order = sorted(range(len(record_ids)), key=record_ids.__getitem__)
        columns = [_reordered(column, order) for column in columns]
    return Columns(columns)


def _reordered(column: Column | Coded, order: list[int]) -> Column | Coded:
    if isinstance(column, Coded):
        return Coded(column.table, list(map(column.codes.__getitem__, order)))
    return list(map(column.__getitem__, order))


def columns_from_entries(entries: Sequence[Entry]) -> Columns:
    return Columns([list(column) for column in zip(*entries)] if entries else [[] for _ in Entry._fields])


class SharedValues:
    """Objects the entries of every rank share, for one load: one copy of each distinct
    group name, op name, shape record, state and stack (see EntryTable.share), and one
    tuple per distinct pg_config rank list.

    Each file's values are interned while it is read, but files are read apart (often in
    other processes), so without this every rank would hold copies of the same stacks,
    and the matcher could not tell equal ops apart by identity."""

    __slots__ = ("values", "rank_lists")

    def __init__(self) -> None:
        self.values: dict[Value, Value] = {}
        self.rank_lists: dict[object, tuple[int, ...]] = {}  # by the tuple, or an array's bytes

    def rank_list(self, ranks: Sequence[int]) -> tuple[int, ...]:
        """The one tuple kept for this list of ranks (a tuple; from a worker, a range or an
        int64 array, looked up by its bytes: hashing 16,384 ints per dump would cost more)."""
        key = ranks.tobytes() if isinstance(ranks, array) else ranks
        kept = self.rank_lists.get(key)
        if kept is None:
            kept = self.rank_lists[key] = tuple(ranks)
        return kept

    def one_of(self, value: Value) -> Value:
        return self.values.setdefault(value, value)


def entry_table(columns: Columns) -> EntryTable:
    """The entries of `columns` as an EntryTable."""
    lists = list(columns.lists)
    static = [lists[position] for position in _STATIC_POSITIONS]
    coded = [c for c in static if isinstance(c, Coded)]
    if len(coded) == len(static) and all(c.codes is coded[0].codes for c in coded):
        # One code per entry for all six: their tables read side by side are the static rows.
        return EntryTable.from_columns(lists, coded[0].codes, list(zip(*(c.table for c in coded))))
    for position, column in zip(_STATIC_POSITIONS, static):
        lists[position] = column.values() if isinstance(column, Coded) else column
    return EntryTable.from_columns(lists)
