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
from collections import deque
from itertools import compress, islice, repeat
from typing import Iterator, Mapping, NamedTuple, Optional, Sequence

from frtrace.model import Entry, has_completed
from frtrace.table.entry_table import EntryTable

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


class SeqMap(Mapping[int, tuple]):
    """collective_seq_id -> the rank's entries under it, oldest first (see module docstring)."""

    __slots__ = ("table", "rows", "seqs", "contiguous", "numbers")

    def __init__(self, table: EntryTable, rows: Sequence[int]) -> None:
        seqs = table.field_at("collective_seq_id", rows)
        rising = all(map(operator.lt, seqs, seqs[1:]))  # as a rule: one entry per number
        if not rising and not all(map(operator.le, seqs, seqs[1:])):
            order = sorted(range(len(rows)), key=seqs.__getitem__)  # stable: a batch keeps its order
            rows, seqs = [rows[k] for k in order], [seqs[k] for k in order]
            rising = all(map(operator.lt, seqs, seqs[1:]))
        self.table = table
        # Rows index the table, and the numbers are sorted now: their bounds are known.
        self.rows = _ints(rows, 0, len(table))
        self.seqs = _ints(seqs, seqs[0], seqs[-1]) if seqs else array("h")
        # One entry per number, none skipped: then a number's row is found by subtraction.
        self.contiguous = not seqs or (rising and seqs[-1] - seqs[0] == len(seqs) - 1)
        # How many distinct numbers it holds (counted once: `len` is asked often).
        self.numbers = len(seqs) if rising else 1 + sum(map(operator.ne, islice(seqs, 1, None), seqs))

    def _span(self, seq: int) -> tuple[int, int]:
        if self.contiguous:
            k = seq - self.seqs[0] if self.seqs else -1
            return (k, k + 1) if 0 <= k < len(self.seqs) else (0, 0)
        low = bisect_left(self.seqs, seq)
        return low, bisect_right(self.seqs, seq, low)

    def __getitem__(self, seq: int) -> tuple:
        low, high = self._span(seq)
        if low == high:
            raise KeyError(seq)
        if high == low + 1:
            return (self.table[self.rows[low]],)
        return self.table.rows(self.rows[low:high])

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        low, high = self._span(seq)
        return low < high

    def __iter__(self) -> Iterator[int]:
        if self.contiguous:
            return iter(range(self.seqs[0], self.seqs[-1] + 1)) if self.seqs else iter(())
        return iter(dict.fromkeys(self.seqs))

    def __len__(self) -> int:
        return self.numbers

    @property
    def dense(self) -> bool:
        """Whether it holds every number from its first to its last (a batch's several
        entries under one of them), as a rank's buffer does unless a number is missing."""
        return not self.seqs or self.numbers == self.seqs[-1] - self.seqs[0] + 1

    def value_at(self, seq: int, name: str):
        """Field `name` of the first entry under `seq`, without building it."""
        low, high = self._span(seq)
        if low == high:
            raise KeyError(seq)
        return self.table.value(name, self.rows[low])

    def oldest_value(self, name: str):
        """Field `name` of the first entry under the lowest number, without building it."""
        return self.table.value(name, self.rows[0])

    def newest_value(self, name: str):
        """Field `name` of the last entry under the highest number, without building it
        (the rows are sorted by number, a batch's in its order)."""
        return self.table.value(name, self.rows[-1])

    def completed_at(self, seq: int) -> bool:
        """Whether the rank completed each of its entries under `seq` (Entry.completed),
        read off the columns."""
        low, high = self._span(seq)
        if low == high:
            raise KeyError(seq)
        return all(row_completed(self.table, row) for row in self.rows[low:high])

    def _layout(self, layouts: Optional[dict]) -> "NumberLayout":
        """The NumberLayout of its numbers, from `layouts` when an equal one is there."""
        if layouts is None or not isinstance(self.seqs, array):
            return NumberLayout.of(self.seqs)
        found = layouts.get((self.seqs.typecode, self.seqs.tobytes()))
        if found is None:
            found = layouts[self.seqs.typecode, self.seqs.tobytes()] = NumberLayout.of(self.seqs)
        return found

    @property
    def first(self) -> Optional[int]:
        return self.seqs[0] if self.seqs else None

    @property
    def last(self) -> Optional[int]:
        return self.seqs[-1] if self.seqs else None

    def keys_at(self, seqs: Sequence[int], key_of_code: Optional[list] = None,
                layouts: Optional[dict] = None) -> list:
        """For each of `seqs` (sorted), what the rank issued under it: `(name, shapes,
        state)` of its one entry, a `BatchKey` of those of a coalesced batch's entries, or
        NOT_SINGLE when it holds none. Read off the codes, in C where the numbers line
        up, without building an Entry. `key_of_code` is `code_keys(self.table)`, which a
        caller reading several groups of one table computes once; `layouts` (one dict
        across SeqMaps) keeps the `NumberLayout`s of their numbers, which the ranks of a
        group mostly share."""
        if key_of_code is None:
            key_of_code = code_keys(self.table)
        codes = self.table.codes
        # A comprehension, not map over codes.__getitem__: an array's method is slow to call.
        row_keys = [key_of_code[codes[row]] for row in self.rows]
        if self.dense and self.seqs:
            first, last = self.seqs[0], self.seqs[-1]
            if seqs and seqs[-1] - seqs[0] == len(seqs) - 1 and seqs[0] <= first and last <= seqs[-1]:
                held = row_keys if self.contiguous else self._layout(layouts).keys(row_keys)
                return [NOT_SINGLE] * (first - seqs[0]) + held + [NOT_SINGLE] * (seqs[-1] - last)
        # Otherwise each number's key is looked up in a table of the rank's own: a batch
        # (several rows under one number, which the sorted rows hold side by side) gets
        # the keys of all its rows (see NumberLayout).
        if self.numbers == len(row_keys):  # one row per number
            own = dict(zip(self.seqs, row_keys))
        else:
            layout = self._layout(layouts)
            own = dict(zip(map(self.seqs.__getitem__, layout.starts), layout.keys(row_keys)))
        return list(map(own.get, seqs, repeat(NOT_SINGLE)))


def row_completed(table: EntryTable, row: int) -> bool:
    """Entry.completed of the table's entry at `row`, without building the Entry."""
    return has_completed(table.statics[table.codes[row]][4], table.value("retired", row),
                     table.value("time_completed_ns", row))


def code_keys(table: EntryTable, shared: Optional[dict] = None) -> list:
    """`(name, shapes, state)` of each code of `table` (see SeqMap.keys_at). With
    `shared` (ids of the three values -> their key, one dict across tables), equal keys
    of tables whose values are shared objects (see EntryTable.share) are one object, so
    the ranks that issued the same op can be told by identity."""
    keys = [(static[2], static[3], static[4]) for static in table.statics]
    if shared is None:
        return keys
    # The dict keeps each key, hence its values and their ids, alive while it lives.
    return [shared.setdefault((id(name), id(shapes), id(state)), (name, shapes, state)) for name, shapes, state in keys]


class NumberLayout(NamedTuple):
    """Where each distinct number of a SeqMap's sorted numbers is among its rows. The
    ranks of a group mostly hold the same numbers, batches alike: one layout serves them
    all (see SeqMap.keys_at)."""

    starts: list[int]  # each number's first row
    batches: list[int]  # the positions (among the numbers) of those held by several rows
    batch_rows: list[slice]  # their rows

    @classmethod
    def of(cls, seqs: Sequence[int]) -> "NumberLayout":
        starts = [0, *compress(range(1, len(seqs)), map(operator.ne, islice(seqs, 1, None), seqs))]
        ends = [*islice(starts, 1, None), len(seqs)]
        batches = list(compress(range(len(starts)), map(operator.gt, map(operator.sub, ends, starts), repeat(1))))
        return cls(starts, batches, [slice(starts[k], ends[k]) for k in batches])

    def keys(self, row_keys: list) -> list:
        """The key of each number, in order, from the keys of the rows (see
        SeqMap.keys_at): a row's own, or a `BatchKey` of a batch's. Python steps once per
        batch, not per number."""
        numbered = list(map(row_keys.__getitem__, self.starts))
        for position, rows in zip(self.batches, self.batch_rows):
            numbered[position] = BatchKey(row_keys[rows])
        return numbered


class BatchKey(tuple):
    """The keys of a coalesced batch's entries: never equal to one entry's key."""

    __slots__ = ()


class RowList(Sequence[Entry]):
    """Some of a rank's entries (a group's P2P ops), oldest first, as rows of its table:
    an Entry is built when one is read."""

    __slots__ = ("table", "rows")

    def __init__(self, table: EntryTable, rows: Sequence[int]) -> None:
        self.table = table
        self.rows = _ints(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return self.table.rows(self.rows[index])
        return self.table[self.rows[index]]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.table.rows(self.rows))

    def __reversed__(self) -> Iterator[Entry]:
        # One by one: readers of the newest ops stop after a few (program order's history).
        return map(self.table.__getitem__, reversed(self.rows))

    def value_at(self, position: int, name: str):
        """Field `name` (outside the static ones) of the entry at `position`, without building it."""
        return self.table.value(name, self.rows[position])

    def names(self) -> list:
        """Each entry's op name (an interned OpName), without building the entries."""
        return self.table.field_at("name", self.rows)


class LazyCalls(Mapping[int, tuple]):
    """rank -> entries at one sequence number, for the ranks of `streams` (a GroupView's
    RankStreams) that issued it (`ranks`, sorted; None: all of them), read from their
    SeqMaps when asked."""

    __slots__ = ("streams", "seq", "ranks")

    def __init__(self, streams: dict, seq: int, ranks: Optional[Sequence[int]] = None) -> None:
        self.streams = streams
        self.seq = seq
        # Kept as a dict's keys: in order, and a rank is looked up among thousands at once.
        self.ranks = None if ranks is None else dict.fromkeys(ranks)

    def __getitem__(self, rank: int) -> tuple:
        if self.ranks is not None and rank not in self.ranks:
            raise KeyError(rank)
        return self.streams[rank].collectives[self.seq]

    def __contains__(self, rank: object) -> bool:
        return rank in (self.streams if self.ranks is None else self.ranks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.streams if self.ranks is None else self.ranks)

    def __len__(self) -> int:
        return len(self.streams if self.ranks is None else self.ranks)

    def first_values(self, name: str) -> list:
        """Each rank's `name` field of its (first) entry, without building the entries."""
        return [self.streams[rank].collectives.value_at(self.seq, name) for rank in self]

    def first_value(self, rank: int, name: str):
        """The rank's `name` field of its (first) entry, without building the entry."""
        if rank not in self:
            raise KeyError(rank)
        return self.streams[rank].collectives.value_at(self.seq, name)

    def __repr__(self) -> str:
        return f"LazyCalls(seq={self.seq}, ranks={list(self)})"


def buckets_by_code(codes: Sequence[int], bucket_of_code: list, buckets: int) -> list[list[int]]:
    """Rows dealt into `buckets` lists by `bucket_of_code[code]`, in one pass in C."""
    dealt: list[list[int]] = [[] for _ in range(buckets)]
    targets = map(dealt.__getitem__, map(bucket_of_code.__getitem__, codes))
    deque(map(list.append, targets, range(len(codes))), maxlen=0)
    return dealt
