"""Fields of many collectives' entries, read a column at a time.

Takes `CollectiveMatch`es (of any groups) and a field name; returns `Block`s: that
field of each rank's first entry in the matches' `calls` (what `LazyCalls.first_values`
gives for each match), laid out a column per rank. A rule that samples thousands of
collectives across thousands of ranks would ask first_values for a million values one
at a time; here the collectives of a group that all the ranks of its streams issued
(their calls are `LazyCalls` over all of the group's streams) are read once per rank,
its rows for every sampled sequence number in one `EntryTable.field_at`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from itertools import chain, compress, repeat
from operator import lt, ne, sub
from typing import NamedTuple, Optional, Sequence

from frtrace.match.matcher import CollectiveMatch
from frtrace.table.seq_map import SeqMap


class Block(NamedTuple):
    """Some collectives of one group that the same ranks issued: `columns[i][j]` is rank
    `ranks[i]`'s value at `matches[j]`, whose calls list exactly `ranks`, in that order."""

    ranks: tuple
    matches: list
    columns: list


def first_value_columns(matches: Sequence[CollectiveMatch], name: str) -> list[Block]:
    """Field `name` of each rank's (first) entry in each of `matches`' calls, in blocks:
    one per group for the collectives all ranks of its streams issued (most), read a rank
    at a time; one per collective for the others (what some ranks never issued or their
    buffers no longer hold), read as first_values reads them. Each match is in one block."""
    blocks: list[Block] = []
    by_all: dict[int, list[CollectiveMatch]] = defaultdict(list)  # id of a group's streams -> its matches
    for match in matches:
        calls = match.calls
        if calls.ranks is None:
            by_all[id(calls.streams)].append(match)
        else:
            blocks.append(Block(tuple(calls), [match], [[value] for value in calls.first_values(name)]))
    for group in by_all.values():
        streams = group[0].calls.streams
        seqs = [match.seq for match in group]
        rising = _rising(seqs)  # the same numbers for every rank of the group: checked once
        # LazyCalls lists the ranks in the order of the streams.
        blocks.append(Block(tuple(streams), group, [_column_at(stream.collectives, seqs, rising, name)
                                                    for stream in streams.values()]))
    return blocks


def _column_at(collectives: SeqMap, seqs: list[int], rising: bool, name: str) -> list:
    """Field `name` of the rank's first entry under each of `seqs` (`rising`: _rising(seqs))."""
    return collectives.table.field_at(name, _first_rows(collectives, seqs, rising))


def first_rows(collectives: SeqMap, seqs: Sequence[int]) -> Sequence[int]:
    """The table row of the rank's first entry under each of `seqs` (the row SeqMap.value_at
    reads); KeyError for a number the rank holds no entry under, as value_at."""
    return _first_rows(collectives, seqs, _rising(seqs))


def _rising(seqs: Sequence[int]) -> bool:
    """Whether each of `seqs` is above the one before (no number twice, none out of order)."""
    return all(map(lt, seqs, seqs[1:]))


def _first_rows(collectives: SeqMap, seqs: Sequence[int], rising: bool) -> Sequence[int]:
    """first_rows, told whether `seqs` are rising."""
    numbers = collectives.seqs  # sorted: a batch's entries side by side, oldest first
    if not seqs:
        return []
    if rising and numbers and not collectives.contiguous:
        rows = _rising_rows(collectives, seqs)
        if rows is not None:
            return rows
    low, high = min(seqs), max(seqs)
    if not numbers or low < numbers[0] or high > numbers[-1]:
        raise KeyError(low if not numbers or low < numbers[0] else high)
    if collectives.contiguous:  # one entry per number, none skipped: found by subtraction
        start = seqs[0] - numbers[0]
        if list(seqs) == list(range(seqs[0], seqs[0] + len(seqs))):  # a run of numbers: a run of rows
            return collectives.rows[start:start + len(seqs)]
        return list(map(collectives.rows.__getitem__, map(sub, seqs, repeat(numbers[0]))))
    starts = list(map(bisect_left, repeat(numbers), seqs))  # each below len(numbers): seq <= the last
    found = list(map(numbers.__getitem__, starts))
    if found != list(seqs):  # a number between two the rank holds
        raise KeyError(next(seq for seq, held in zip(seqs, found) if held != seq))
    return list(map(collectives.rows.__getitem__, starts))


def _rising_rows(collectives: SeqMap, seqs: Sequence[int]) -> Optional[list[int]]:
    """first_rows of rising `seqs` that are every number the rank holds from the first of
    them to the last (a sample of a group's newest collectives, with batches among them:
    several rows under one number), found in one pass in C over the rows between: the
    first row under each number is where the number changes. None when they are not."""
    numbers = collectives.seqs
    start = bisect_left(numbers, seqs[0])
    stop = bisect_right(numbers, seqs[-1], start)
    held = numbers[start:stop]
    firsts = list(compress(range(start, stop), map(ne, held, chain((None,), held))))
    if list(map(numbers.__getitem__, firsts)) != list(seqs):
        return None
    return list(map(collectives.rows.__getitem__, firsts))
