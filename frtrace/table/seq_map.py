"""Lookups into one rank's `EntryTable` by sequence number, for the matcher.

Takes an EntryTable and the rows of one group's collectives; returns a `SeqMap`, a
read-only mapping collective_seq_id -> tuple of Entry (several for a coalesced batch)
that holds two machine words per entry and builds Entry tuples only when one is read.
`LazyCalls` is a collective's `calls` (rank -> its entries), read from the members'
SeqMaps on demand: the matcher judges a collective from the codes of its entries, and
nobody reads them unless a finding, `-j` or an export asks.
"""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_left, bisect_right
from itertools import chain, compress, islice, repeat
from typing import (
    Callable,
    Iterator,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Union,
    overload,
)

from frtrace.model import Entry, OpName, Shapes, has_completed
from frtrace.table.entry_table import EntryTable, Value

# Stands in a key column for a sequence number a rank holds no entry of.
NOT_SINGLE = object()


def _ints(values: Sequence[int], low: Optional[int] = None, high: Optional[int] = None) -> Sequence[int]:
    """`values` in the narrowest int array that holds them (rows of a 2,000-entry buffer
    take two bytes), or a list when none does (a corrupt dump's sequence numbers).
    `low` and `high`, when the caller knows them, bound the values (no pass to find them)."""
    if not values:
        return array("h")
    if low is None or high is None:
        low, high = min(values), max(values)
    for typecode in ("h", "i", "q"):
        size = 8 * array(typecode).itemsize
        if -(1 << (size - 1)) <= low and high < 1 << (size - 1):
            return array(typecode, values)
    return list(values)


class OpKey(NamedTuple):
    """What a rank issued at a sequence number, as its entry says: the matcher compares
    these across ranks (see SeqMap.keys_at)."""

    name: OpName
    shapes: Shapes
    state: str


class BatchKey(tuple[OpKey, ...]):
    """The keys of a coalesced batch's entries: never equal to one entry's key."""

    __slots__ = ()


# What SeqMap.keys_at gives for one number: one entry's key, a batch's, or NOT_SINGLE.
NumberKey = Union[OpKey, BatchKey, object]


class SeqMap(Mapping[int, tuple[Entry, ...]]):
    """collective_seq_id -> the rank's entries under it, oldest first (see module docstring)."""

    __slots__ = ("_table", "_rows", "_seqs", "_contiguous", "_numbers")

    def __init__(self, table: EntryTable, rows: Sequence[int]) -> None:
        seqs = table.field_at("collective_seq_id", rows)
        rising = all(map(operator.lt, seqs, seqs[1:]))  # as a rule: one entry per number
        if not rising and not all(map(operator.le, seqs, seqs[1:])):
            order = sorted(range(len(rows)), key=seqs.__getitem__)  # stable: a batch keeps its order
            rows, seqs = [rows[k] for k in order], [seqs[k] for k in order]
            rising = all(map(operator.lt, seqs, seqs[1:]))
        self._table = table
        # Rows index the table, and the numbers are sorted now: their bounds are known.
        self._rows = _ints(rows, 0, len(table))
        self._seqs = _ints(seqs, seqs[0], seqs[-1]) if seqs else array("h")
        # One entry per number, none skipped: then a number's row is found by subtraction.
        self._contiguous = not seqs or (rising and seqs[-1] - seqs[0] == len(seqs) - 1)
        # How many distinct numbers it holds (counted once: `len` is asked often).
        self._numbers = len(seqs) if rising else 1 + sum(map(operator.ne, islice(seqs, 1, None), seqs))

    @classmethod
    def joined(cls, maps: Sequence["SeqMap"]) -> "SeqMap":
        """One map of the entries of `maps` (of one table: a group the rank records under
        several names), back in the rank's order."""
        return cls(maps[0].table, sorted(row for seq_map in maps for row in seq_map._rows))

    @property
    def table(self) -> EntryTable:
        """The rank's table the entries are rows of."""
        return self._table

    def without_first(self) -> "SeqMap":
        """The map without the entries under its lowest number."""
        low, high = self._span(self._seqs[0]) if self._seqs else (0, 0)
        return SeqMap(self._table, list(self._rows[high:])) if high else self

    def numbered_rows(self) -> tuple[Sequence[int], Sequence[int]]:
        """The sequence number of each entry the map holds, in order (a batch's entries
        share one), and beside it the entry's row."""
        return self._seqs, self._rows

    def _span(self, seq: int) -> tuple[int, int]:
        if self._contiguous:
            k = seq - self._seqs[0] if self._seqs else -1
            return (k, k + 1) if 0 <= k < len(self._seqs) else (0, 0)
        low = bisect_left(self._seqs, seq)
        return low, bisect_right(self._seqs, seq, low)

    def __getitem__(self, seq: int) -> tuple[Entry, ...]:
        low, high = self._span(seq)
        if low == high:
            raise KeyError(seq)
        if high == low + 1:
            return (self._table[self._rows[low]],)
        return self._table.rows(self._rows[low:high])

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        low, high = self._span(seq)
        return low < high

    def __iter__(self) -> Iterator[int]:
        if self._contiguous:
            return iter(range(self._seqs[0], self._seqs[-1] + 1)) if self._seqs else iter(())
        return iter(dict.fromkeys(self._seqs))

    def __len__(self) -> int:
        return self._numbers

    @property
    def dense(self) -> bool:
        """Whether it holds every number from its first to its last (a batch's several
        entries under one of them), as a rank's buffer does unless a number is missing."""
        return not self._seqs or self._numbers == self._seqs[-1] - self._seqs[0] + 1

    def value_at(self, seq: int, name: str) -> Value:
        """Field `name` of the first entry under `seq`, without building it."""
        low, high = self._span(seq)
        if low == high:
            raise KeyError(seq)
        return self._table.value(name, self._rows[low])

    def oldest_value(self, name: str) -> Value:
        """Field `name` of the first entry under the lowest number, without building it."""
        return self._table.value(name, self._rows[0])

    def newest_value(self, name: str) -> Value:
        """Field `name` of the last entry under the highest number, without building it
        (the rows are sorted by number, a batch's in its order)."""
        return self._table.value(name, self._rows[-1])

    def completed_at(self, seq: int) -> bool:
        """Whether the rank completed each of its entries under `seq` (Entry.completed),
        read off the columns."""
        low, high = self._span(seq)
        if low == high:
            raise KeyError(seq)
        return all(row_completed(self._table, row) for row in self._rows[low:high])

    @property
    def first(self) -> Optional[int]:
        return self._seqs[0] if self._seqs else None

    @property
    def last(self) -> Optional[int]:
        return self._seqs[-1] if self._seqs else None

    def first_rows(self, seqs: Sequence[int]) -> Sequence[int]:
        """The table row of the first entry under each of `seqs` (the row `value_at`
        reads); KeyError for a number it holds no entry under, as value_at. A range of
        numbers a dense map holds is read off one slice of its rows, in C (a sampling rule
        asks for a million rows at 4,096 ranks); `_first_rows_one_by_one` is its plain twin."""
        if isinstance(seqs, range) and seqs.step == 1 and len(seqs) and self._seqs and self.dense:
            if self._contiguous:
                low = seqs.start - self._seqs[0]
                if 0 <= low and low + len(seqs) <= len(self._seqs):
                    return self._rows[low:low + len(seqs)]
            elif self._seqs[0] <= seqs.start and seqs[-1] <= self._seqs[-1]:
                # A dense map holds every number in between: the first entry under each
                # is the one whose number differs from that of the entry before it.
                low, high = bisect_left(self._seqs, seqs.start), bisect_right(self._seqs, seqs[-1])
                numbers = self._seqs[low:high]
                return list(compress(self._rows[low:high], map(operator.ne, numbers, chain((None,), numbers))))
        return self._first_rows_one_by_one(seqs)

    def _first_rows_one_by_one(self, seqs: Sequence[int]) -> list[int]:
        rows = []
        for seq in seqs:
            low, high = self._span(seq)
            if low == high:
                raise KeyError(seq)
            rows.append(self._rows[low])
        return rows

    def field_at_first(self, name: str, seqs: Sequence[int]) -> list[Value]:
        """Field `name` of the first entry under each of `seqs` (see first_rows), read a
        column at a time."""
        return self._table.field_at(name, self.first_rows(seqs))

    def keys_at(self, seqs: Sequence[int], op_keys: Optional["OpKeys"] = None) -> list[NumberKey]:
        """For each of `seqs` (sorted), what the rank issued under it: the `OpKey` of its
        one entry, a `BatchKey` of those of a coalesced batch's entries, or NOT_SINGLE
        when it holds none. Read off the codes, in C where the numbers line up, without
        building an Entry. `op_keys` (one for the tables a match reads) computes each
        table's keys once, equal keys one object across tables."""
        key_of_code = code_keys(self._table) if op_keys is None else op_keys.of(self._table)
        codes = self._table.codes
        # A comprehension, not map over codes.__getitem__: an array's method is slow to call.
        row_keys = [key_of_code[codes[row]] for row in self._rows]
        if self.dense and self._seqs:
            first, last = self._seqs[0], self._seqs[-1]
            if seqs and seqs[-1] - seqs[0] == len(seqs) - 1 and seqs[0] <= first and last <= seqs[-1]:
                held = row_keys if self._contiguous else NumberLayout.of(self._seqs).keys(row_keys)
                return [NOT_SINGLE] * (first - seqs[0]) + held + [NOT_SINGLE] * (seqs[-1] - last)
        # Otherwise each number's key is looked up in a table of the rank's own: a batch
        # (several rows under one number, which the sorted rows hold side by side) gets
        # the keys of all its rows (see NumberLayout).
        if self._numbers == len(row_keys):  # one row per number
            own: dict[int, NumberKey] = dict(zip(self._seqs, row_keys))
        else:
            layout = NumberLayout.of(self._seqs)
            own = dict(zip(map(self._seqs.__getitem__, layout.starts), layout.keys(row_keys)))
        return list(map(own.get, seqs, repeat(NOT_SINGLE)))

    def keys_at_plain(self, seqs: Sequence[int], op_keys: Optional["OpKeys"] = None) -> list[NumberKey]:
        """keys_at's plain twin: each number's rows looked up on their own."""
        key_of_code = code_keys(self._table) if op_keys is None else op_keys.of(self._table)
        keys: list[NumberKey] = []
        for seq in seqs:
            low, high = self._span(seq)
            row_keys = [key_of_code[code] for code in map(self._table.codes.__getitem__, self._rows[low:high])]
            keys.append(NOT_SINGLE if not row_keys else row_keys[0] if len(row_keys) == 1 else BatchKey(row_keys))
        return keys


def row_completed(table: EntryTable, row: int) -> bool:
    """Entry.completed of the table's entry at `row`, without building the Entry."""
    return has_completed(table.static_row(row).state, table.value("retired", row),
                         table.value("time_completed_ns", row))


def code_keys(table: EntryTable, shared: Optional[dict[tuple[int, int, int], OpKey]] = None) -> list[OpKey]:
    """The `OpKey` of each code of `table` (see SeqMap.keys_at). With `shared` (ids of
    the three values -> their key, one dict across tables), equal keys of tables whose
    values are shared objects (see EntryTable.share) are one object, so the ranks that
    issued the same op can be told by identity."""
    keys = [OpKey(static.name, static.shapes, static.state) for static in table.statics]
    if shared is None:
        return keys
    # The dict keeps each key, hence its values and their ids, alive while it lives.
    return [shared.setdefault((id(key.name), id(key.shapes), id(key.state)), key) for key in keys]


class OpKeys:
    """Each table's `code_keys` for one match, computed once per table (a rank's table
    serves each group the rank is in), equal keys one object across tables. Keyed by
    the tables' identity, each table held, so that no id is ever another table's."""

    __slots__ = ("_of_table", "_shared")

    def __init__(self) -> None:
        self._of_table: dict[int, tuple[EntryTable, list[OpKey]]] = {}
        self._shared: dict[tuple[int, int, int], OpKey] = {}

    def of(self, table: EntryTable) -> list[OpKey]:
        cached = self._of_table.get(id(table))
        if cached is None or cached[0] is not table:
            cached = self._of_table[id(table)] = (table, code_keys(table, self._shared))
        return cached[1]


class NumberLayout(NamedTuple):
    """Where each distinct number of a SeqMap's sorted numbers is among its rows (see
    SeqMap.keys_at)."""

    starts: list[int]  # each number's first row
    batches: list[int]  # the positions (among the numbers) of those held by several rows
    batch_rows: list[slice]  # their rows

    @classmethod
    def of(cls, seqs: Sequence[int]) -> "NumberLayout":
        starts = [0, *compress(range(1, len(seqs)), map(operator.ne, islice(seqs, 1, None), seqs))]
        ends = [*islice(starts, 1, None), len(seqs)]
        batches = list(compress(range(len(starts)), map(operator.gt, map(operator.sub, ends, starts), repeat(1))))
        return cls(starts, batches, [slice(starts[k], ends[k]) for k in batches])

    def keys(self, row_keys: list[OpKey]) -> list[NumberKey]:
        """The key of each number, in order, from the keys of the rows (see
        SeqMap.keys_at): a row's own, or a `BatchKey` of a batch's. Python steps once per
        batch, not per number."""
        numbered: list[NumberKey] = list(map(row_keys.__getitem__, self.starts))
        for position, rows in zip(self.batches, self.batch_rows):
            numbered[position] = BatchKey(row_keys[rows])
        return numbered


class RowList(Sequence[Entry]):
    """Some of a rank's entries (a group's P2P ops), oldest first, as rows of its table:
    an Entry is built when one is read."""

    __slots__ = ("_table", "_rows")

    def __init__(self, table: EntryTable, rows: Sequence[int]) -> None:
        self._table = table
        self._rows = _ints(rows)

    @classmethod
    def joined(cls, lists: Sequence["RowList"]) -> "RowList":
        """One list of the entries of `lists` (of one table), back in the rank's order."""
        return cls(lists[0].table, sorted(row for row_list in lists for row in row_list._rows))

    @property
    def table(self) -> EntryTable:
        """The rank's table the entries are rows of."""
        return self._table

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Entry, ...]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Entry, tuple[Entry, ...]]:
        if isinstance(index, slice):
            return self._table.rows(self._rows[index])
        return self._table[self._rows[index]]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._table.rows(self._rows))

    def __reversed__(self) -> Iterator[Entry]:
        # One by one: readers of the newest ops stop after a few (program order's history).
        return map(self._table.__getitem__, reversed(self._rows))

    def newest(self, count: int) -> "RowList":
        """The newest `count` entries (all, where there are fewer)."""
        return RowList(self._table, self._rows[max(0, len(self._rows) - count):])

    def row(self, position: int) -> int:
        """The table row of the entry at `position`."""
        return self._rows[position]

    def value_at(self, position: int, name: str) -> Value:
        """Field `name` (outside the static ones) of the entry at `position`, without building it."""
        return self._table.value(name, self._rows[position])

    def field(self, name: str) -> list[Value]:
        """Each entry's `name` field, oldest first, without building the entries."""
        return self._table.field_at(name, self._rows)

    def names(self) -> list[OpName]:
        """Each entry's op name (an interned OpName), without building the entries."""
        return [static.name for static in self._table.static_rows(self._rows)]

    def names_newest_first(self) -> Iterator[tuple[int, OpName]]:
        """(position, op name) of each entry, newest first: read one by one (readers stop
        after a few), without building the entries."""
        table, rows = self._table, self._rows
        return ((k, table.static_row(rows[k]).name) for k in range(len(rows) - 1, -1, -1))

    def names_newest_first_plain(self) -> Iterator[tuple[int, OpName]]:
        """names_newest_first's plain twin: each entry built, and its name read."""
        return ((k, self[k].name) for k in range(len(self) - 1, -1, -1))

    def deal_by_name(self, bucket_of: Callable[[OpName], list[int]]) -> None:
        """Append the row of each entry, in order, to the list `bucket_of(its op name)`
        gives, asked once per static row (a rank posts along a few channels under a few)."""
        codes, statics = self._table.codes, self._table.statics
        bucket_of_code: dict[int, list[int]] = {}
        for row in self._rows:
            code = codes[row]
            bucket = bucket_of_code.get(code)
            if bucket is None:
                bucket = bucket_of_code[code] = bucket_of(statics[code].name)
            bucket.append(row)

    def unfinished_rows(self) -> set[int]:
        """The rows of the entries whose op did not complete (Entry.completed false). Most
        ops say they completed in their state, a static field read once per static row;
        only the others have retired and time_completed_ns read."""
        table, rows = self._table, self._rows
        codes, statics = table.codes, table.statics
        row_codes = [codes[row] for row in rows]
        unsure_codes = {code for code in set(row_codes) if statics[code].state != "completed"}
        if not unsure_codes:
            return set()
        unsure = list(compress(rows, map(unsure_codes.__contains__, row_codes)))
        states = table.field_at("state", unsure)
        retired, done_ns = table.field_at("retired", unsure), table.field_at("time_completed_ns", unsure)
        return {row for row, *fields in zip(unsure, states, retired, done_ns) if not has_completed(*fields)}


class HasCollectives(Protocol):
    """What LazyCalls reads of a rank's stream in a group (the matcher's RankStream)."""

    @property
    def collectives(self) -> SeqMap: ...


class LazyCalls(Mapping[int, tuple[Entry, ...]]):
    """rank -> entries at one sequence number, for the ranks of `streams` (a GroupView's
    RankStreams) that issued it (`ranks`, sorted; None: all of them), read from their
    SeqMaps when asked."""

    __slots__ = ("streams", "seq", "ranks")

    def __init__(self, streams: Mapping[int, HasCollectives], seq: int, ranks: Optional[Sequence[int]] = None) -> None:
        self.streams = streams
        self.seq = seq
        # Kept as a dict's keys: in order, and a rank is looked up among thousands at once.
        self.ranks = None if ranks is None else dict.fromkeys(ranks)

    def __getitem__(self, rank: int) -> tuple[Entry, ...]:
        if self.ranks is not None and rank not in self.ranks:
            raise KeyError(rank)
        return self.streams[rank].collectives[self.seq]

    def __contains__(self, rank: object) -> bool:
        return rank in (self.streams if self.ranks is None else self.ranks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.streams if self.ranks is None else self.ranks)

    def __len__(self) -> int:
        return len(self.streams if self.ranks is None else self.ranks)

    def first_values(self, name: str) -> list[Value]:
        """Each rank's `name` field of its (first) entry, without building the entries."""
        return [self.streams[rank].collectives.value_at(self.seq, name) for rank in self]

    def first_value(self, rank: int, name: str) -> Value:
        """The rank's `name` field of its (first) entry, without building the entry."""
        if rank not in self:
            raise KeyError(rank)
        return self.streams[rank].collectives.value_at(self.seq, name)

    def __repr__(self) -> str:
        return f"LazyCalls(seq={self.seq}, ranks={list(self)})"


# Fast paths beside their plain twins (see frtrace.testing.twins).
PLAIN_TWINS = {"SeqMap.keys_at": SeqMap.keys_at_plain, "RowList.names_newest_first": RowList.names_newest_first_plain}
