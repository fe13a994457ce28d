"""One rank's entries held as columns, read as `Entry` tuples only when asked for.

Takes the columns of one rank's entries (from the loader's fast path, or plain Entry
tuples); returns an `EntryTable`, a read-only `Sequence[Entry]`. An Entry tuple with its
ints costs some 300 bytes; here an entry costs one code (its group, op, shapes, state and
stack together: a row of a small table shared across the rank's entries) and one machine
int per other field, each column in the narrowest array that holds it (about 20 bytes an
entry on a healthy NCCL rank), and an Entry is built only for the rows someone reads (a
finding, `-j`, an export). Loader workers build the table and send it as it is (a
versioned pickle of arrays and the static rows).

Every field keeps the exact value the loader normalised: ints of any size, None,
bools, floats. A column whose values fit a machine array (None written as a value no
entry holds) is stored in one, a column of one value as that value; any other column
stays a list.
"""

from __future__ import annotations

import math
import operator
from array import array
from itertools import compress, repeat
from typing import (
    Any,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    TypeVar,
    Union,
    overload,
)

from frtrace.model import Entry, Frame, OpName, Shapes

Answer = TypeVar("Answer")

_NONE = type(None)
_new_entry = tuple.__new__
# One field's value, as the loader normalised it: its type depends on the field (an int,
# a float, a bool, None, a str, an OpName ...), so the columns hand it over untyped.
Value = Any
# What the entries of one coalesced batch share: (pg_name, is_p2p, their P2P sequence
# number if P2P, else their collective one); see standing.batch_key.
BatchId = tuple[str, bool, int]
# What finding a batch's bounds reads of an entry (see batches.batch_facts).
BatchFacts = tuple[str, bool, BatchId, int]
# What a column keeps its values in (see _Column).
Values = Union["array[Any]", range, list[Value], "_Same"]
# The fields that make up an entry's static part, stored as one code per entry.
STATIC_FIELDS = ("pg_name", "pg_desc", "name", "shapes", "state", "frames")
_STATIC_POSITIONS = tuple(Entry._fields.index(f) for f in STATIC_FIELDS)
_OTHER_POSITIONS = tuple(i for i in range(len(Entry._fields)) if i not in _STATIC_POSITIONS)
_COLUMN_OF = {Entry._fields[position]: k for k, position in enumerate(_OTHER_POSITIONS)}
# The machine int arrays, narrowest first, with the range each holds.
INT_RANGES = {code: (-(1 << (8 * array(code).itemsize - 1)), (1 << (8 * array(code).itemsize - 1)) - 1)
               for code in ("b", "h", "i", "q")}
_FLOAT_NONE = -math.inf  # None in a float column that holds no -inf itself
TABLE_FORMAT = 3  # of a pickled EntryTable (see EntryTable.__reduce__); 2: static rows are StaticRows;
# 3: with the codes in use
_FEW_ROWS = 8  # up to this many rows are read one by one (see EntryTable.rows)


class StaticRow(NamedTuple):
    """The static part of an entry (its STATIC_FIELDS), which the entries of one op in one
    group share: a table holds each distinct one once, and an entry its code."""

    pg_name: str
    pg_desc: str
    name: OpName
    shapes: Shapes
    state: str
    frames: tuple[Frame, ...]


class GroupRows(NamedTuple):
    """The rows of one group name's entries in a table, each list oldest first."""

    collectives: list[int]
    p2p: list[int]  # its P2P ops, without the markers that close a P2P batch
    p2p_markers: list[int]  # those markers: they say which P2P ops were batched, and are no op


class ValuePool(Protocol):
    """One object kept per distinct value (entry_columns.SharedValues: see EntryTable.share)."""

    values: dict[Value, Value]


class _Same:
    """A column whose every value is one object (`timeout_ms`; the start and end times of
    a dump recorded without them)."""

    __slots__ = ("value", "length")

    def __init__(self, value: Value, length: int) -> None:
        self.value, self.length = value, length

    def __getitem__(self, row: int) -> Value:
        return self.value

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Value]:
        return repeat(self.value, self.length)


class _Column:
    """One non-static field: `values` (an array, a range or a list) and, for an array that
    stands for other values (None, bools), `decode`, which maps a stored value to its own."""

    __slots__ = ("values", "decode")

    def __init__(self, values: Values, decode: Optional[dict[Value, Value]] = None) -> None:
        self.values = values
        self.decode = decode

    def read(self, row: int) -> Value:
        value = self.values[row]
        return self.decode.get(value, value) if self.decode else value

    def read_rows(self, rows: Sequence[int]) -> list[Value]:
        if isinstance(self.values, _Same):
            return [self.values.value] * len(rows)
        values = self.values
        return self._decoded([values[row] for row in rows])  # faster than map over an array's __getitem__

    def read_all(self) -> list[Value]:
        return self._decoded(list(self.values))

    def _decoded(self, values: list[Value]) -> list[Value]:
        return list(map(self.decode.get, values, values)) if self.decode else values

    def write(self, rows: Sequence[int], values: Sequence[Value]) -> None:
        """Store `values` at `rows`: in place where the column can hold them as they are,
        else after turning it into a list (once)."""
        current = self.read_rows(rows)
        if all(map(_same_value, current, values)):
            return  # settling a batch leaves most fields as they were
        if isinstance(self.values, array) and all(_fits(self.values, value, self.decode) for value in values):
            for row, value in zip(rows, values):
                self.values[row] = _encoded(value, self.decode)
            return
        if not isinstance(self.values, list):
            self.values, self.decode = self.read_all(), None  # a value the array cannot hold
        for row, value in zip(rows, values):
            self.values[row] = value

    def nbytes(self) -> int:
        if isinstance(self.values, array):
            return self.values.itemsize * len(self.values)
        return 8 * len(self.values) if isinstance(self.values, list) else 0


def _same_value(old: Value, new: Value) -> bool:
    """The same value of the same type (1, 1.0 and True are equal, and all are stored apart)."""
    return old is new or (type(old) is type(new) and old == new)


def _fits(values: "array[Any]", value: Value, decode: Optional[dict[Value, Value]]) -> bool:
    """Whether `values` can hold `value` (and give it back as it is)."""
    if value is None:
        return decode is not None and None in decode.values()
    if decode is _BOOLS:
        return type(value) is bool
    if values.typecode == "d":
        return type(value) is float and not math.isnan(value) and value != _FLOAT_NONE
    low, high = INT_RANGES[values.typecode]
    return type(value) is int and low < value <= high  # the lowest value is kept for None


def _encoded(value: Value, decode: Optional[dict[Value, Value]]) -> Value:
    if decode:
        for stored, meant in decode.items():
            if meant is value:  # None, True, False: identity, since 1 == True
                return stored
    return value


_BOOLS: dict[Value, Value] = {-1: None, 0: False, 1: True}
_BOOL_CODES = {meant: stored for stored, meant in _BOOLS.items()}


def _all_alike(values: Sequence[Value]) -> bool:
    """Every value equal to the first, and of its type (1, 1.0 and True are equal)."""
    first, last = values[0], values[-1]
    if last is not first and (type(last) is not type(first) or last != first):
        return False  # as a rule: the values of a column that differ, differ at its ends
    if isinstance(values, array) and values.typecode in INT_RANGES:
        # compared whole in C (memcmp), where counting would make an int of each value
        return values == array(values.typecode, [first]) * len(values)
    if first is None or isinstance(values, array):
        return values.count(first) == len(values)
    return values.count(first) == len(values) and set(map(type, values)) == {type(first)} \
        and not (isinstance(first, float) and math.isnan(first))


def narrowest_int_array(values: Sequence[int], low: int, high: int) -> "Optional[array[int]]":
    """`values` (ints from `low` to `high`) in the narrowest machine array that holds them
    and one value below them (kept for None), or None when none does."""
    typecode = _narrowest_typecode(low, high)
    return None if typecode is None else array(typecode, values)


def _narrowest_typecode(low: int, high: int) -> Optional[str]:
    for typecode, (type_low, type_high) in INT_RANGES.items():
        if type_low < low and high <= type_high:
            return typecode
    return None


def _int_column(values: Sequence[Optional[int]], present: Sequence[int], has_none: bool) -> Optional[_Column]:
    """`values` (ints, and None where `has_none`) in the narrowest array that holds them
    and one value below them, which stands for None."""
    low, high = min(present), max(present)
    if not has_none:
        ints = narrowest_int_array(values, low, high)  # type: ignore[arg-type]  # no None: ints
        return None if ints is None else _Column(ints)
    typecode = _narrowest_typecode(low, high)
    if typecode is None:
        return None
    none = INT_RANGES[typecode][0]
    return _Column(array(typecode, [none if v is None else v for v in values]), {none: None})


def column_of(values: Sequence[Value]) -> _Column:
    """The most compact column holding exactly `values` (their types kept too)."""
    if isinstance(values, range):
        return _Column(values)
    if values and _all_alike(values):
        return _Column(_Same(values[0], len(values)))
    if isinstance(values, array) and values.typecode in INT_RANGES:  # narrowed already (narrowest_int_array)
        return _Column(values)
    if values and type(values[0]) is bool and list(map(type, values)).count(bool) == len(values):  # `retired`
        return _Column(array("b", bytes(values)), _BOOLS)
    values = list(values)
    kinds = set(map(type, values))
    has_none = _NONE in kinds
    present = [v for v in values if v is not None] if has_none else values
    if kinds <= {int, _NONE} and present:
        column = _int_column(values, present, has_none)
        if column is not None:
            return column
    if kinds <= {bool, _NONE}:
        return _Column(array("b", map(_BOOL_CODES.__getitem__, values) if has_none else values), _BOOLS)
    if kinds <= {float, _NONE} and not any(math.isnan(v) or v == _FLOAT_NONE for v in present):
        if not has_none:
            return _Column(array("d", values))
        return _Column(array("d", [_FLOAT_NONE if v is None else v for v in values]), {_FLOAT_NONE: None})
    return _Column(values)


class EntryTable(Sequence[Entry]):
    """A rank's entries, oldest first, as columns (see module docstring). Read-only to
    its users; the loader settles batches through `replace` before anyone reads it."""

    __slots__ = ("_codes", "_statics", "_static_code", "_columns", "_length", "_readers", "_in_use")

    def __init__(self, codes: "array[int]", statics: list[StaticRow], columns: list[_Column],
                 in_use: Optional[list[int]] = None) -> None:
        self._codes = codes  # static row of each entry
        self._statics = statics  # one per code
        self._static_code: Optional[dict[tuple[int, ...], int]] = None  # built on the first `replace`
        self._columns = columns  # one per field outside STATIC_FIELDS, in Entry order
        self._length = len(codes)
        # See _read: the columns' containers, and (position, decode) of those that decode.
        self._readers: Optional[tuple[tuple[Values, ...], tuple[tuple[int, dict[Value, Value]], ...]]] = None
        self._in_use = in_use  # the codes entries hold, where known: see statics_in_use

    # ---- building and transfer

    def __reduce__(self) -> tuple[Callable[..., "EntryTable"],
                                  tuple[int, "array[int]", list[StaticRow], list[_Column], list[int]]]:
        # Tables cross from loader workers (and cluster workers) to the main process:
        # arrays and the few static rows pickle at memory speed. The codes in use go
        # along, found by the worker: the main process would read every entry's code.
        # The format number lets a reader refuse a table written by another version of
        # this module.
        return _table_from_parts, (TABLE_FORMAT, self._codes, self._statics, self._columns, self._codes_in_use())

    def compact(self) -> None:
        """Store again, as compactly as they now allow, the columns `replace` turned into
        lists (settling a batch writes its marker's times over ops that had none)."""
        self._columns = [column_of(column.read_all()) if isinstance(column.values, list) else column
                         for column in self._columns]
        self._readers = self._static_code = None  # the lookup `replace` built is not kept

    def share(self, shared: ValuePool) -> None:
        """Swap the static rows' values for the objects `shared` (SharedValues) keeps, one
        per distinct value across ranks: tables built apart (in worker processes) hold
        copies, and the matcher tells equal ops apart by identity first."""
        one_of = shared.values.setdefault  # (SharedValues.one_of, without a call in Python per value)
        self._statics = [StaticRow._make(map(one_of, static, static)) for static in self._statics]
        self._static_code = None  # the codes in use stay: the rows are swapped one for one

    @classmethod
    def from_columns(cls, lists: Sequence[Sequence[Value]], codes: Optional[Sequence[int]] = None,
                     statics: Optional[Sequence[tuple[object, ...]]] = None) -> "EntryTable":
        """A table of the 18 columns `lists` (one per Entry field, in order). `codes` and
        `statics`, when given, hold the static fields already coded; the static columns
        of `lists` are then not read."""
        if codes is None or statics is None:
            codes, statics = _coded_statics([lists[i] for i in _STATIC_POSITIONS])
        columns = [column_of(lists[i]) for i in _OTHER_POSITIONS]
        return cls(_code_array(codes, len(statics)), list(map(StaticRow._make, statics)), columns)

    @classmethod
    def from_entries(cls, entries: Sequence[Entry]) -> "EntryTable":
        if isinstance(entries, EntryTable):
            return entries
        lists: list[list[Value]] = [list(column) for column in zip(*entries)] if entries else [[] for _ in Entry._fields]
        return cls.from_columns(lists)

    def replace(self, changes: Mapping[int, Entry]) -> None:
        """Store each entry of `changes` (row -> entry) as that row (the loader, settling
        the batches of a dump of only active entries)."""
        if not changes:
            return
        for row, entry in changes.items():
            self._codes[row] = self._code_of(StaticRow._make(map(entry.__getitem__, _STATIC_POSITIONS)))
        rows, entries = list(changes), list(changes.values())
        for column, position in zip(self._columns, _OTHER_POSITIONS):
            column.write(rows, [entry[position] for entry in entries])
        self._readers = self._in_use = None

    def copy_fields(self, targets: Sequence[int], sources: Sequence[int], names: Sequence[str]) -> None:
        """Give the entry at each of `targets` the fields `names` of the entry at the source
        beside it (the loader, settling batches: in a job of batched P2P, half of a rank's
        entries take their marker's state), without building an Entry."""
        for name in names:
            if name in STATIC_FIELDS:
                self.set_static(targets, name, self.field_at(name, sources))
            else:
                column = self._columns[_COLUMN_OF[name]]
                column.write(targets, column.read_rows(sources))
        self._readers = self._in_use = None

    def set_field(self, rows: Sequence[int], name: str, values: Sequence[Value]) -> None:
        """Set the field `name` (not one of STATIC_FIELDS) of the entries at `rows` to `values`."""
        self._columns[_COLUMN_OF[name]].write(rows, values)
        self._readers = self._in_use = None

    def set_static(self, rows: Sequence[int], name: str, values: Sequence[Value]) -> None:
        """Set the static field `name` (see STATIC_FIELDS) of the entries at `rows` to `values`."""
        k = STATIC_FIELDS.index(name)
        codes, statics = self._codes, self._statics
        for row, value in zip(rows, values):
            static = statics[codes[row]]
            if static[k] is not value:
                self._codes[row] = self._code_of(StaticRow._make(static[:k] + (value,) + static[k + 1:]))
        self._in_use = None

    def _code_of(self, static: StaticRow) -> int:
        """The code of a static row, added when new."""
        if self._static_code is None:
            # Keyed by the identity of the static values: a settled entry reuses the objects
            # of the entries it came from, and hashing a stack would cost more than the rest.
            self._static_code = {tuple(map(id, known)): code for code, known in enumerate(self._statics)}
        key = tuple(map(id, static))
        code = self._static_code.get(key)
        if code is None:  # kept in _statics, so the ids in the key stay its objects'
            code = self._static_code[key] = len(self._statics)
            self._statics.append(static)
            if code >= 1 << (8 * self._codes.itemsize):
                self._codes = array("I", self._codes)
        return code

    def take(self, rows: Sequence[int]) -> "EntryTable":
        """A table of the entries at `rows`, in that order (sharing this one's static rows)."""
        columns = [column_of(column.read_rows(rows)) for column in self._columns]
        codes = array(self._codes.typecode, map(self._codes.__getitem__, rows))
        return EntryTable(codes, list(self._statics), columns)

    # ---- reading

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Entry, ...]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Entry, tuple[Entry, ...]]:
        if isinstance(index, slice):
            return self.rows(range(*index.indices(self._length)))
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("entry index out of range")
        static = self._statics[self._codes[index]]
        c = self._read(index)
        return _new_entry(Entry, (
            c[0], c[1], static[0], static[1], c[2], c[3], c[4], c[5], static[2], static[3], static[4], c[6],
            c[7], c[8], c[9], c[10], c[11], static[5]))

    def _read(self, row: int) -> list[Value]:
        """The non-static fields of one row. One entry is read at a time all through the
        diagnosis: the columns' values are fetched in one pass in C, and only the columns
        that stand for other values (None, bools) are decoded in Python."""
        if self._readers is None:
            self._readers = (tuple(column.values for column in self._columns),
                             tuple((k, column.decode) for k, column in enumerate(self._columns) if column.decode))
        containers, decoders = self._readers
        values = list(map(operator.getitem, containers, repeat(row, len(containers))))
        for k, decode in decoders:
            value = values[k]
            values[k] = decode.get(value, value)
        return values

    def rows(self, rows: Sequence[int]) -> tuple[Entry, ...]:
        """The entries at `rows`, built a column at a time (a few, one by one: reading
        every column for them would cost more)."""
        if len(rows) <= _FEW_ROWS:
            return tuple(map(self.__getitem__, rows))
        statics = list(map(self._statics.__getitem__, map(self._codes.__getitem__, rows)))
        fields: list[Iterable[Value]] = [()] * len(Entry._fields)
        for k, position in enumerate(_STATIC_POSITIONS):
            fields[position] = map(operator.itemgetter(k), statics)
        for column, position in zip(self._columns, _OTHER_POSITIONS):
            fields[position] = column.read_rows(rows)
        return tuple(map(_new_entry, repeat(Entry), zip(*fields)))

    def rows_plain(self, rows: Sequence[int]) -> tuple[Entry, ...]:
        """rows's plain twin: the entries one by one."""
        return tuple(map(self.__getitem__, rows))

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.rows(range(self._length)))

    def __reversed__(self) -> Iterator[Entry]:
        return iter(self.rows(range(self._length - 1, -1, -1)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EntryTable):
            other = tuple(other)
        return isinstance(other, tuple) and tuple(self) == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EntryTable({self._length} entries)"

    # ---- columns, for the matcher

    def field(self, name: str) -> list[Value]:
        """Every entry's `name` field, oldest first."""
        position = Entry._fields.index(name)
        if position in _STATIC_POSITIONS:
            k = _STATIC_POSITIONS.index(position)
            return [static[k] for static in map(self._statics.__getitem__, self._codes)]
        return self._columns[_OTHER_POSITIONS.index(position)].read_all()

    def value(self, name: str, row: int) -> Value:
        """One field (outside STATIC_FIELDS) of one entry, without building the Entry."""
        return self._columns[_COLUMN_OF[name]].read(row)

    def batch_facts_reader(self) -> Callable[[int], BatchFacts]:
        """batches.batch_facts of the entry at a row, without building the Entry: a
        function of the row, the columns looked up once (the loader reads it some 14 times
        per batch it settles)."""
        codes, statics = self._codes, self._statics
        collective_seq, p2p_seq = self._columns[_COLUMN_OF["collective_seq_id"]], self._columns[_COLUMN_OF["p2p_seq_id"]]

        def facts(row: int) -> BatchFacts:
            static = statics[codes[row]]
            name, pg_name = static.name, static.pg_name
            seq = collective_seq.read(row)
            return pg_name, name.is_coalesced_marker, (pg_name, name.is_p2p, p2p_seq.read(row) if name.is_p2p else seq), seq
        return facts

    def number_readers(self) -> tuple[Callable[[int], Value], Callable[[int], Value]]:
        """The collective_seq_id and the p2p_seq_id of the entry at a row: two functions
        of the row (an array's own lookup where the column stores the values as they are)."""
        return self._reader("collective_seq_id"), self._reader("p2p_seq_id")

    def _reader(self, name: str) -> Callable[[int], Value]:
        column = self._columns[_COLUMN_OF[name]]
        return column.read if column.decode else column.values.__getitem__

    def batch_key(self, row: int) -> BatchId:
        """standing.batch_key of the entry at `row`, without building the Entry."""
        static = self._statics[self._codes[row]]
        is_p2p = static.name.is_p2p
        return static.pg_name, is_p2p, self.value("p2p_seq_id" if is_p2p else "collective_seq_id", row)

    def field_at(self, name: str, rows: Sequence[int]) -> list[Value]:
        """The `name` field of the entries at `rows`."""
        position = Entry._fields.index(name)
        if position in _STATIC_POSITIONS:
            k = _STATIC_POSITIONS.index(position)
            statics, codes = self._statics, self._codes
            return [statics[codes[row]][k] for row in rows]
        return self._columns[_OTHER_POSITIONS.index(position)].read_rows(rows)

    def static_values(self, name: str) -> list[Value]:
        """The distinct values of a static field (see STATIC_FIELDS) that entries hold, in
        the order they first appear."""
        k = STATIC_FIELDS.index(name)
        return list(dict.fromkeys(static[k] for static in self.statics_in_use()))

    def statics_in_use(self) -> list[StaticRow]:
        """The static rows entries hold, in the order they first appear."""
        return list(map(self._statics.__getitem__, self._codes_in_use()))

    def _codes_in_use(self) -> list[int]:
        if self._in_use is None:
            self._in_use = list(dict.fromkeys(self._codes))
        return self._in_use

    def static_row(self, row: int) -> StaticRow:
        """The static part of the entry at `row` (a row its like entries share)."""
        return self._statics[self._codes[row]]

    def static_rows(self, rows: Iterable[int]) -> list[StaticRow]:
        """The static part of each entry at `rows`."""
        statics, codes = self._statics, self._codes
        return [statics[codes[row]] for row in rows]

    def static_answers(self, judge: Callable[[StaticRow], Answer], rows: Sequence[int]) -> list[Answer]:
        """`judge` of the static part of the entry at each of `rows`. Entries share a few
        static rows: each is judged once, and the answers laid out over the rows in C."""
        answers = [judge(static) for static in self._statics]
        codes = self._codes
        if len(rows) < 2:
            return [answers[codes[row]] for row in rows]
        picked = operator.itemgetter(*rows)(codes)
        return list(operator.itemgetter(*picked)(answers)) if len(picked) > 1 else [answers[picked[0]]]

    def rows_where(self, judge: Callable[[StaticRow], Optional[Answer]]) -> list[tuple[int, Answer]]:
        """(row, answer) for each entry whose static part `judge` answers (not None), oldest
        first; each static row is judged once, and the rows found in C."""
        hits = {code: answer for code, answer in enumerate(map(judge, self._statics)) if answer is not None}
        if not hits:  # as a rule
            return []
        codes = self._codes
        rows = list(compress(range(len(codes)), map(hits.__contains__, codes)))
        return [(row, hits[codes[row]]) for row in rows]

    def rows_by_group(self) -> dict[str, GroupRows]:
        """pg_name -> the rows of the group's collectives, P2P ops and P2P batch markers,
        in the order the groups first appear. A rank holds thousands of entries in a
        handful of groups: each code is placed once, and the rows dealt by their codes."""
        statics = self._statics
        names = list(dict.fromkeys(static.pg_name for static in self.statics_in_use()))
        # Bucket 3k holds the collectives of the k-th name, 3k+1 its P2P ops, 3k+2 the
        # markers among those (a collective batch's marker stays with the collectives).
        first_bucket = {name: 3 * k for k, name in enumerate(names)}
        bucket_of_code = [first_bucket.get(static.pg_name, 0)
                          + (1 + static.name.is_coalesced_marker if static.name.is_p2p else 0) for static in statics]
        buckets = buckets_by_code(self._codes, bucket_of_code, 3 * len(names))
        return {name: GroupRows(*buckets[3 * k:3 * k + 3]) for k, name in enumerate(names)}

    @property
    def codes(self) -> "array[int]":
        """The static row of each entry (see `statics`). For table/ only: the layers above
        ask the named questions (tests/test_layers.py checks)."""
        return self._codes

    @property
    def statics(self) -> list[StaticRow]:
        """The static row of each code; do not change it. For table/ only, as `codes`."""
        return self._statics

    def nbytes(self) -> int:
        """The bytes its columns take (the static rows not counted: shared objects)."""
        return self._codes.itemsize * self._length + sum(column.nbytes() for column in self._columns)


def _table_from_parts(version: int, codes: "array[int]", statics: list[StaticRow], columns: list[_Column],
                      in_use: Optional[list[int]] = None) -> EntryTable:
    if version != TABLE_FORMAT:  # (an older format passes no in_use)
        raise ValueError(f"entry table format {version}, this version reads {TABLE_FORMAT}")
    return EntryTable(codes, list(statics), columns, in_use)


def _coded_statics(static_columns: Sequence[Sequence[Value]]) -> tuple["array[int]", list[StaticRow]]:
    """(codes, distinct static rows) of the six static columns."""
    keys = list(zip(*static_columns))
    distinct = list(dict.fromkeys(keys))
    code_of = {key: code for code, key in enumerate(distinct)}
    return _code_array(list(map(code_of.__getitem__, keys)), len(distinct)), list(map(StaticRow._make, distinct))


def _code_array(codes: Sequence[int], count: int) -> "array[int]":
    """`codes` (each below `count`) in two bytes each where they fit, else four."""
    return array("H" if count <= 1 << 16 else "I", codes)


def buckets_by_code(codes: Sequence[int], bucket_of_code: Sequence[int], buckets: int) -> list[list[int]]:
    """Rows dealt into `buckets` lists by `bucket_of_code[code]`."""
    dealt: list[list[int]] = [[] for _ in range(buckets)]
    for row, code in enumerate(codes):
        dealt[bucket_of_code[code]].append(row)
    return dealt


# Fast paths beside their plain twins (see frtrace.testing.twins).
PLAIN_TWINS = {"EntryTable.rows": EntryTable.rows_plain}
