"""One rank's entries dealt into its process groups: the per-rank part of the match.

Takes a rank's `EntryTable`; returns `GroupParts`, pg_name -> `GroupPart` (the group's
collectives by sequence number, its P2P ops, and which of those were batched), built
from the table's rows without making an Entry. It needs nothing from other ranks, so
the loader's worker processes run it on each dump they decode (the parts travel back
with the table, a few bytes per entry), and the process that matches the groups only
puts them together.
"""

from __future__ import annotations

from typing import NamedTuple

from frtrace.table.entry_table import EntryTable
from frtrace.table.seq_map import RowList, SeqMap


class GroupPart(NamedTuple):
    """One rank's entries of one process group name, in order."""

    by_sequence: SeqMap  # collective_seq_id -> tuple of entries (several for a coalesced batch)
    p2p: RowList  # without the markers that close a batch
    batched: frozenset[int]  # p2p_seq_ids of P2P batches (batch_isend_irecv), closed by a marker


# pg_name -> that group's part of one rank's entries, in the order the groups first appear.
GroupParts = dict[str, GroupPart]


# Most groups batch no P2P op: one empty set serves them all (and a worker's batch of
# results, pickled together, sends it once).
NO_BATCHES: frozenset[int] = frozenset()


def deal_by_group(table: EntryTable) -> GroupParts:
    """The parts of `table` for each group name it holds entries of."""
    return {name: GroupPart(SeqMap(table, rows.collectives), RowList(table, rows.p2p),
                            frozenset(table.field_at("p2p_seq_id", rows.p2p_markers)) if rows.p2p_markers else NO_BATCHES)
            for name, rows in table.rows_by_group().items()}
