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
from itertools import repeat
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union, overload

from frtrace.model import Entry

_NONE = type(None)
_new_entry = tuple.__new__
# The fields that make up an entry's static part, stored as one code per entry.
STATIC_FIELDS = ("pg_name", "pg_desc", "name", "shapes", "state", "frames")
_STATIC_POSITIONS = tuple(Entry._fields.index(f) for f in STATIC_FIELDS)
_OTHER_POSITIONS = tuple(i for i in range(len(Entry._fields)) if i not in _STATIC_POSITIONS)
_COLUMN_OF = {Entry._fields[position]: k for k, position in enumerate(_OTHER_POSITIONS)}
# The machine int arrays, narrowest first, with the range each holds.
INT_RANGES = {code: (-(1 << (8 * array(code).itemsize - 1)), (1 << (8 * array(code).itemsize - 1)) - 1)
               for code in ("b", "h", "i", "q")}
_FLOAT_NONE = -math.inf  # None in a float column that holds no -inf itself
TABLE_FORMAT = 1  # of a pickled EntryTable (see EntryTable.__reduce__)
_FEW_ROWS = 8  # up to this many rows are read one by one (see EntryTable.rows)


class _Same:
    """A column whose every value is one object (`timeout_ms`; the start and end times of
    a dump recorded without them)."""

    __slots__ = ("value", "length")

    def __init__(self, value, length: int) -> None:
        self.value, self.length = value, length

    def __getitem__(self, row: int):
        return self.value

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator:
        return repeat(self.value, self.length)


class _Column:
    """One non-static field: `values` (an array, a range or a list) and, for an array that
    stands for other values (None, bools), `decode`, which maps a stored value to its own."""

    __slots__ = ("values", "decode")

    def __init__(self, values: Union[array, range, list, _Same], decode: Optional[dict] = None) -> None:
        self.values = values
        self.decode = decode

    def read(self, row: int):
        value = self.values[row]
        return self.decode.get(value, value) if self.decode else value

    def read_rows(self, rows: Sequence[int]) -> list:
        if isinstance(self.values, _Same):
            return [self.values.value] * len(rows)
        values = self.values
        return self._decoded([values[row] for row in rows])  # faster than map over an array's __getitem__

    def read_all(self) -> list:
        return self._decoded(list(self.values))

    def _decoded(self, values: list) -> list:
        return list(map(self.decode.get, values, values)) if self.decode else values

    def write(self, rows: Sequence[int], values: Sequence) -> None:
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


def _same_value(old, new) -> bool:
    """The same value of the same type (1, 1.0 and True are equal, and all are stored apart)."""
    return old is new or (type(old) is type(new) and old == new)


def _fits(values: array, value, decode: Optional[dict]) -> bool:
    """Whether `values` can hold `value` (and give it back as it is)."""
    if value is None:
        return decode is not None and None in decode.values()
    if decode is _BOOLS:
        return type(value) is bool
    if values.typecode == "d":
        return type(value) is float and not math.isnan(value) and value != _FLOAT_NONE
    low, high = INT_RANGES[values.typecode]
    return type(value) is int and low < value <= high  # the lowest value is kept for None


def _encoded(value, decode: Optional[dict]):
    if decode:
        for stored, meant in decode.items():
            if meant is value:  # None, True, False: identity, since 1 == True
                return stored
    return value


_BOOLS = {-1: None, 0: False, 1: True}
_BOOL_CODES = {meant: stored for stored, meant in _BOOLS.items()}


def _all_alike(values: Sequence) -> bool:
    """Every value equal to the first, and of its type (1, 1.0 and True are equal)."""
    first = values[0]
    if first is None or isinstance(values, array):
        return values.count(first) == len(values)
    return values.count(first) == len(values) and set(map(type, values)) == {type(first)} \
        and not (isinstance(first, float) and math.isnan(first))


def narrowest_int_array(values: Sequence[int], low: int, high: int) -> Optional[array]:
    """`values` (ints from `low` to `high`) in the narrowest machine array that holds them
    and one value below them (kept for None), or None when none does."""
    typecode = _narrowest_typecode(low, high)
    return None if typecode is None else array(typecode, values)


def _narrowest_typecode(low: int, high: int) -> Optional[str]:
    for typecode, (type_low, type_high) in INT_RANGES.items():
        if type_low < low and high <= type_high:
            return typecode
    return None


def _int_column(values: Sequence, present: Sequence[int], has_none: bool) -> Optional[_Column]:
    """`values` (ints, and None where `has_none`) in the narrowest array that holds them
    and one value below them, which stands for None."""
    low, high = min(present), max(present)
    if not has_none:
        ints = narrowest_int_array(values, low, high)
        return None if ints is None else _Column(ints)
    typecode = _narrowest_typecode(low, high)
    if typecode is None:
        return None
    none = INT_RANGES[typecode][0]
    return _Column(array(typecode, [none if v is None else v for v in values]), {none: None})


def column_of(values: Sequence) -> _Column:
    """The most compact column holding exactly `values` (their types kept too)."""
    if isinstance(values, range):
        return _Column(values)
    if values and _all_alike(values):
        return _Column(_Same(values[0], len(values)))
    if isinstance(values, array) and values.typecode in INT_RANGES:  # narrowed already (narrowest_int_array)
        return _Column(values)
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

    def __init__(self, codes: array, statics: list, columns: list[_Column]) -> None:
        self._codes = codes  # static row of each entry
        self._statics = statics  # (pg_name, pg_desc, name, shapes, state, frames) per code
        self._static_code: Optional[dict] = None  # built on the first `replace`
        self._columns = columns  # one per field outside STATIC_FIELDS, in Entry order
        self._length = len(codes)
        self._readers: Optional[tuple] = None  # see _read
        self._in_use: Optional[list] = None  # see statics_in_use

    # ---- building and transfer

    def __reduce__(self):
        # Tables cross from loader workers (and cluster workers) to the main process:
        # arrays and the few static rows pickle at memory speed. The format number lets
        # a reader refuse a table written by another version of this module.
        return _table_from_parts, (TABLE_FORMAT, self._codes, self._statics, self._columns)

    def compact(self) -> None:
        """Store again, as compactly as they now allow, the columns `replace` turned into
        lists (settling a batch writes its marker's times over ops that had none)."""
        self._columns = [column_of(column.read_all()) if isinstance(column.values, list) else column
                         for column in self._columns]
        self._readers = self._static_code = None  # the lookup `replace` built is not kept

    def share(self, shared) -> None:
        """Swap the static rows' values for the objects `shared` (SharedValues) keeps, one
        per distinct value across ranks: tables built apart (in worker processes) hold
        copies, and the matcher tells equal ops apart by identity first."""
        one_of = shared.values.setdefault  # (SharedValues.one_of, without a call in Python per value)
        self._statics = [tuple(map(one_of, static, static)) for static in self._statics]
        self._static_code = self._in_use = None

    @classmethod
    def from_columns(cls, lists: Sequence, codes: Optional[Sequence[int]] = None,
                     statics: Optional[Sequence[tuple]] = None) -> "EntryTable":
        """A table of the 18 columns `lists` (one per Entry field, in order). `codes` and
        `statics`, when given, hold the static fields already coded; the static columns
        of `lists` are then not read."""
        if codes is None or statics is None:
            codes, statics = _coded_statics([lists[i] for i in _STATIC_POSITIONS])
        columns = [column_of(lists[i]) for i in _OTHER_POSITIONS]
        return cls(_code_array(codes, len(statics)), list(statics), columns)

    @classmethod
    def from_entries(cls, entries: Sequence[Entry]) -> "EntryTable":
        if isinstance(entries, EntryTable):
            return entries
        lists = [list(column) for column in zip(*entries)] if entries else [[] for _ in Entry._fields]
        return cls.from_columns(lists)

    def replace(self, changes: Mapping[int, Entry]) -> None:
        """Store each entry of `changes` (row -> entry) as that row (the loader, settling
        the batches of a dump of only active entries)."""
        if not changes:
            return
        for row, entry in changes.items():
            self._codes[row] = self._code_of(tuple(map(entry.__getitem__, _STATIC_POSITIONS)))
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

    def set_static(self, rows: Sequence[int], name: str, values: Sequence) -> None:
        """Set the static field `name` (see STATIC_FIELDS) of the entries at `rows` to `values`."""
        k = STATIC_FIELDS.index(name)
        codes, statics = self._codes, self._statics
        for row, value in zip(rows, values):
            static = statics[codes[row]]
            if static[k] is not value:
                self._codes[row] = self._code_of(static[:k] + (value,) + static[k + 1:])
        self._in_use = None

    def _code_of(self, static: tuple) -> int:
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
    def __getitem__(self, index: slice) -> tuple: ...

    def __getitem__(self, index):
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

    def _read(self, row: int) -> list:
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

    def rows(self, rows: Sequence[int]) -> tuple:
        """The entries at `rows`, built a column at a time (a few, one by one: reading
        every column for them would cost more)."""
        if len(rows) <= _FEW_ROWS:
            return tuple(map(self.__getitem__, rows))
        statics = list(map(self._statics.__getitem__, map(self._codes.__getitem__, rows)))
        fields: list = [None] * len(Entry._fields)
        for k, position in enumerate(_STATIC_POSITIONS):
            fields[position] = map(operator.itemgetter(k), statics)
        for column, position in zip(self._columns, _OTHER_POSITIONS):
            fields[position] = column.read_rows(rows)
        return tuple(map(_new_entry, repeat(Entry), zip(*fields)))

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.rows(range(self._length)))

    def __reversed__(self) -> Iterator[Entry]:
        return iter(self.rows(range(self._length - 1, -1, -1)))

    def __eq__(self, other) -> bool:
        if isinstance(other, EntryTable):
            other = tuple(other)
        return isinstance(other, tuple) and tuple(self) == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EntryTable({self._length} entries)"

    # ---- columns, for the matcher

    def field(self, name: str) -> list:
        """Every entry's `name` field, oldest first."""
        position = Entry._fields.index(name)
        if position in _STATIC_POSITIONS:
            k = _STATIC_POSITIONS.index(position)
            return [static[k] for static in map(self._statics.__getitem__, self._codes)]
        return self._columns[_OTHER_POSITIONS.index(position)].read_all()

    def value(self, name: str, row: int):
        """One field (outside STATIC_FIELDS) of one entry, without building the Entry."""
        return self._columns[_COLUMN_OF[name]].read(row)

    def batch_facts_reader(self) -> Callable[[int], tuple]:
        """batches.batch_facts of the entry at a row, without building the Entry: a
        function of the row, the columns looked up once (the loader reads it some 14 times
        per batch it settles)."""
        codes, statics = self._codes, self._statics
        collective_seq, p2p_seq = self._columns[_COLUMN_OF["collective_seq_id"]], self._columns[_COLUMN_OF["p2p_seq_id"]]

        def facts(row: int) -> tuple:
            static = statics[codes[row]]
            name = static[2]
            seq = collective_seq.read(row)
            return static[0], name.is_coalesced_marker, (static[0], name.is_p2p, p2p_seq.read(row) if name.is_p2p else seq), seq
        return facts

    def batch_key(self, row: int) -> tuple:
        """standing.batch_key of the entry at `row`, without building the Entry."""
        static = self._statics[self._codes[row]]
        is_p2p = static[2].is_p2p
        return static[0], is_p2p, self.value("p2p_seq_id" if is_p2p else "collective_seq_id", row)

    def field_at(self, name: str, rows: Sequence[int]) -> list:
        """The `name` field of the entries at `rows`."""
        position = Entry._fields.index(name)
        if position in _STATIC_POSITIONS:
            k = _STATIC_POSITIONS.index(position)
            statics, codes = self._statics, self._codes
            return [statics[codes[row]][k] for row in rows]
        return self._columns[_OTHER_POSITIONS.index(position)].read_rows(rows)

    def static_values(self, name: str) -> list:
        """The distinct values of a static field (see STATIC_FIELDS) that entries hold, in
        the order they first appear."""
        k = STATIC_FIELDS.index(name)
        return list(dict.fromkeys(static[k] for static in self.statics_in_use()))

    def statics_in_use(self) -> list:
        """The static rows entries hold, in the order they first appear."""
        if self._in_use is None:
            self._in_use = list(map(self._statics.__getitem__, dict.fromkeys(self._codes)))
        return self._in_use

    @property
    def codes(self) -> array:
        """The static row of each entry (see `statics`)."""
        return self._codes

    @property
    def statics(self) -> list:
        """(pg_name, pg_desc, name, shapes, state, frames) of each code; do not change it."""
        return self._statics

    def nbytes(self) -> int:
        """The bytes its columns take (the static rows not counted: shared objects)."""
        return self._codes.itemsize * self._length + sum(column.nbytes() for column in self._columns)


def _table_from_parts(version: int, codes: array, statics: list, columns: list) -> EntryTable:
    if version != TABLE_FORMAT:
        raise ValueError(f"entry table format {version}, this version reads {TABLE_FORMAT}")
    return EntryTable(codes, list(statics), columns)


def _coded_statics(static_columns: list) -> tuple:
    """(codes, distinct static rows) of the six static columns."""
    keys = list(zip(*static_columns))
    distinct = list(dict.fromkeys(keys))
    code_of = {key: code for code, key in enumerate(distinct)}
    return _code_array(list(map(code_of.__getitem__, keys)), len(distinct)), distinct


def _code_array(codes: Sequence[int], count: int) -> array:
    """`codes` (each below `count`) in two bytes each where they fit, else four."""
    return array("H" if count <= 1 << 16 else "I", codes)
