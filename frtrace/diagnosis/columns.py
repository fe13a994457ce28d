"""Fields of many collectives' entries, read a column at a time.

Takes `CollectiveMatch`es (of any groups) and a field name; returns, per match, that
field of each rank's first entry in its `calls`, in the order the calls list the
ranks: what `matcher.first_values` gives for each match, read differently. A rule that
samples thousands of collectives across thousands of ranks would ask first_values for a
million values one at a time; here the collectives a group's matcher settled (their
calls are `LazyCalls` over the group's streams) are read once per member, its rows for
every sampled sequence number in one `EntryTable.field_at`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from itertools import repeat
from operator import sub
from typing import Sequence

from ..matcher import CollectiveMatch, first_values
from ..rank_index import LazyCalls, SeqMap


def first_values_of(matches: Sequence[CollectiveMatch], name: str) -> list[list]:
    """[first_values(match.calls, name) for match in matches], read per group and rank."""
    values: list[list] = [[] for _ in matches]
    settled: dict[int, list[int]] = defaultdict(list)  # id of a group's streams -> positions of its LazyCalls
    for position, match in enumerate(matches):
        if isinstance(match.calls, LazyCalls):
            settled[id(match.calls.streams)].append(position)
        else:  # a few: what members disagree on, or did not all finish
            values[position] = first_values(match.calls, name)
    for positions in settled.values():
        group_values = _first_values_in_group([matches[p] for p in positions], name)
        for position, row in zip(positions, group_values):
            values[position] = row
    return values


def _first_values_in_group(matches: list[CollectiveMatch], name: str) -> list[list]:
    """first_values of each of `matches`, whose calls are LazyCalls over one group's
    streams. Most were issued by every rank of the streams: each rank's values at all of
    those are read at once, and its column lines up with theirs. The few some ranks do
    not hold (their buffer no longer reaches back, say) are read a value at a time."""
    calls: list[LazyCalls] = [match.calls for match in matches]  # type: ignore[misc]  # see first_values_of
    values = [lazy.first_values(name) if lazy.ranks is not None else [] for lazy in calls]
    by_all = [k for k, lazy in enumerate(calls) if lazy.ranks is None]
    if by_all:
        streams = calls[by_all[0]].streams
        seqs = [calls[k].seq for k in by_all]
        columns = [_column_at(stream.collectives, seqs, name) for stream in streams.values()]
        for k, row in zip(by_all, zip(*columns)):  # LazyCalls lists the ranks in the streams' order
            values[k] = list(row)
    return values


def _column_at(collectives, seqs: list[int], name: str) -> list:
    """Field `name` of the rank's first entry under each of `seqs`."""
    collectives = _seq_map(collectives)
    return collectives.table.field_at(name, first_rows(collectives, seqs))


def first_rows(collectives: SeqMap, seqs: Sequence[int]) -> Sequence[int]:
    """The table row of the rank's first entry under each of `seqs` (the row SeqMap.value_at
    reads); KeyError for a number the rank holds no entry under, as value_at."""
    numbers = collectives.seqs  # sorted: a batch's entries side by side, oldest first
    if not seqs:
        return []
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


def _seq_map(collectives) -> SeqMap:
    """A settled collective's member holds its collectives in a SeqMap (LazyCalls reads them
    through SeqMap.value_at)."""
    if not isinstance(collectives, SeqMap):
        raise TypeError(f"settled calls read from a {type(collectives).__name__}, not a SeqMap")
    return collectives
