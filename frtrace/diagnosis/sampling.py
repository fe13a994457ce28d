"""Fields of many collectives' entries, read a column at a time.

Takes `CollectiveMatch`es (of any groups) and a field name; returns `Block`s: that
field of each rank's first entry in the matches' `calls` (what `LazyCalls.first_values`
gives for each match), laid out a column per rank. A rule that samples thousands of
collectives across thousands of ranks would ask first_values for a million values one
at a time; here the collectives of a group that all the ranks of its streams issued
(their calls are `LazyCalls` over all of the group's streams) are read once per rank,
its rows for every sampled sequence number in one `SeqMap.field_at_first`.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import NamedTuple, Sequence

from frtrace.match.matcher import CollectiveMatch
from frtrace.table.entry_table import Value


class Block(NamedTuple):
    """Some collectives of one group that the same ranks issued: `columns[i][j]` is rank
    `ranks[i]`'s value at `matches[j]`, whose calls list exactly `ranks`, in that order."""

    ranks: tuple[int, ...]
    matches: list[CollectiveMatch]
    columns: list[list[Value]]


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
        seqs = _as_range([match.seq for match in group])
        # LazyCalls lists the ranks in the order of the streams.
        blocks.append(Block(tuple(streams), group, [stream.collectives.field_at_first(name, seqs)
                                                    for stream in streams.values()]))
    return blocks


def _as_range(seqs: list[int]) -> Sequence[int]:
    """`seqs` as a range when they are consecutive (a group's newest collectives, as a
    rule), which a rank's SeqMap reads as one slice of its rows (SeqMap.first_rows)."""
    if seqs and seqs[-1] - seqs[0] == len(seqs) - 1 and all(map(operator.lt, seqs, seqs[1:])):
        return range(seqs[0], seqs[-1] + 1)
    return seqs
