"""SeqMap and LazyCalls answer exactly what a dict of Entry tuples would: any order of
sequence numbers, batches, gaps, numbers no machine int holds, and ranks that did not
issue a collective."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frtrace.model import Entry, OpName, Shapes
from frtrace.table.entry_table import EntryTable
from frtrace.table.seq_map import (
    NOT_SINGLE,
    BatchKey,
    LazyCalls,
    OpKey,
    OpKeys,
    RowList,
    SeqMap,
    code_keys,
)

_OP = OpName("nccl:all_reduce", "nccl", "all_reduce", False)
_SHAPES = Shapes(((4,),), ("Float",), ((4,),), ("Float",))


def _entry(index: int, seq: int, state: str = "completed") -> Entry:
    return Entry(index, index, "0", "pg", 0, seq, 0, index, _OP, _SHAPES, state, None, 10 + index, None, None,
                 None, None, ())


_seqs = st.lists(st.one_of(st.integers(min_value=0, max_value=40), st.sampled_from([2**63, 2**70, -(2**64)])),
                 min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(_seqs)
def test_seqmap_is_a_dict_of_each_numbers_entries(seqs):
    entries = [_entry(i, seq, ("completed", "started", "scheduled")[i % 3]) for i, seq in enumerate(seqs)]
    table = EntryTable.from_entries(entries)
    index = SeqMap(table, range(len(entries)))
    expected: dict = {}
    for entry in entries:
        expected.setdefault(entry.collective_seq_id, []).append(entry)
    assert dict(index) == {seq: tuple(batch) for seq, batch in expected.items()}
    assert list(index) == sorted(expected) and len(index) == len(expected)
    assert index.dense == (len(expected) == max(expected) - min(expected) + 1)
    assert (index.first, index.last) == (min(expected), max(expected))
    # The oldest and newest entries, as the matcher reads them to place pg_status.
    assert index.oldest_value("index") == next(iter(index.values()))[0].index
    assert index.newest_value("index") == index[index.last][-1].index
    assert [index.completed_at(seq) for seq in index] == [all(e.completed for e in index[seq]) for seq in index]
    assert 12345 not in index and index.get(12345) is None
    probe = sorted(set(expected) | {min(expected) - 1, max(expected) + 1})
    keys = index.keys_at(probe)
    assert index.keys_at(probe, OpKeys()) == keys == index.keys_at_plain(probe)
    for seq, key in zip(probe, keys):
        batch = expected.get(seq, [])
        if not batch:
            assert key is NOT_SINGLE
        elif len(batch) == 1:
            assert key == (_OP, _SHAPES, batch[0].state) and not isinstance(key, BatchKey)
        else:
            assert isinstance(key, BatchKey) and list(key) == [(_OP, _SHAPES, e.state) for e in batch]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=12), min_size=1, max_size=4),
       st.integers(min_value=-3, max_value=3))
def test_keys_of_ranks_holding_each_number_once_or_in_a_batch(ranks, first):
    """The case keys_at reads through a layout of the numbers (NumberLayout): each rank
    holds a run of numbers, some as batches."""
    op_keys = OpKeys()
    for counts in ranks:  # a rank: how many entries it holds under each number from `first` on
        held = [first + k for k, count in enumerate(counts) for _ in range(count)]
        entries = [_entry(i, seq, ("completed", "started")[i % 2]) for i, seq in enumerate(held)]
        table = EntryTable.from_entries(entries)
        index = SeqMap(table, range(len(entries)))
        assert index.dense and len(index) == len(counts)
        probe = range(first - 2, first + len(counts) + 1)
        batches = [[e for e in entries if e.collective_seq_id == seq] for seq in probe]
        expected = [NOT_SINGLE if not batch else OpKey(_OP, _SHAPES, batch[0].state) if len(batch) == 1
                    else BatchKey(OpKey(_OP, _SHAPES, e.state) for e in batch) for batch in batches]
        keys = index.keys_at(probe, op_keys)
        assert keys == expected and index.keys_at(list(probe)) == expected == index.keys_at_plain(probe)
        assert [type(key) for key in keys] == [type(key) for key in expected]


def test_lazy_calls_over_some_ranks_reads_only_theirs():
    streams = {}
    for rank in range(4):
        table = EntryTable.from_entries([_entry(i, i + 1) for i in range(5)])
        stream = type("Stream", (), {})()
        stream.collectives = SeqMap(table, range(5))
        streams[rank] = stream
    calls = LazyCalls(streams, 3, (0, 2))
    assert list(calls) == [0, 2] and len(calls) == 2 and 2 in calls and 1 not in calls
    assert calls[2] == (_entry(2, 3),)
    with pytest.raises(KeyError):
        calls[1]
    assert calls.first_values("time_created_ns") == [12, 12]
    everyone = LazyCalls(streams, 5)
    assert dict(everyone) == {rank: (_entry(4, 5),) for rank in range(4)}


def test_row_list_reads_its_rows_in_order_and_newest_first():
    entries = [_entry(i, i) for i in range(10)]
    rows = RowList(EntryTable.from_entries(entries), [1, 4, 7])
    assert list(rows) == [entries[1], entries[4], entries[7]]
    assert list(reversed(rows)) == [entries[7], entries[4], entries[1]]
    assert rows[-1] == entries[7] and rows[0:2] == (entries[1], entries[4])
    assert rows.names() == [_OP] * 3
    assert (rows.value_at(0, "record_id"), rows.value_at(-1, "record_id")) == (1, 7)


def test_code_keys_of_equal_ops_are_one_object_across_tables():
    shared: dict = {}
    first = code_keys(EntryTable.from_entries([_entry(0, 1)]), shared)
    second = code_keys(EntryTable.from_entries([_entry(0, 1, "started"), _entry(1, 2)]), shared)
    assert first == [(_OP, _SHAPES, "completed")] and second == [(_OP, _SHAPES, "started"), (_OP, _SHAPES, "completed")]
    assert second[1] is first[0]
