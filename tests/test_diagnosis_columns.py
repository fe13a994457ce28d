"""The diagnosis's column reads (frtrace/diagnosis/sampling.py) give exactly what reading
one value at a time gives (`SeqMap.value_at`, `LazyCalls.first_values`): any sequence
numbers, batches, gaps, numbers no machine int holds, wrapped buffers, and collectives
only some ranks hold."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts
from hypothesis import given, settings
from hypothesis import strategies as st

from frtrace.diagnosis.sampling import first_value_columns
from frtrace.model import Entry, OpName, Shapes
from frtrace.table.entry_table import EntryTable
from frtrace.table.seq_map import LazyCalls, SeqMap
from frtrace.testing.synth import Fault, generate

_OP = OpName("nccl:all_reduce", "nccl", "all_reduce", False)
_SHAPES = Shapes(((4,),), ("Float",), ((4,),), ("Float",))


def _entry(index: int, seq: int) -> Entry:
    return Entry(index, index, "0", "pg", 0, seq, 0, index, _OP, _SHAPES, "completed", None, 1000 + 7 * index,
                 None, None, None, None, ())


_seqs = st.lists(st.one_of(st.integers(min_value=0, max_value=40), st.sampled_from([2**63, 2**70, -(2**64)])),
                 min_size=1, max_size=30)


def _value_at_each(index: SeqMap, seqs: list) -> list:
    return [index.value_at(seq, "time_created_ns") for seq in seqs]


@settings(max_examples=300, deadline=None)
@given(_seqs, st.data())
def test_first_rows_reads_the_rows_value_at_reads(seqs, data):
    table = EntryTable.from_entries([_entry(i, seq) for i, seq in enumerate(seqs)])
    index = SeqMap(table, range(len(seqs)))
    held = sorted(set(seqs))
    # Numbers it holds, in any order, repeated or not, as one run or with gaps.
    wanted = data.draw(st.one_of(st.lists(st.sampled_from(held), max_size=20), st.just(held),
                                 st.just(held[1:-1])))
    assert table.field_at("time_created_ns", index.first_rows(wanted)) == _value_at_each(index, wanted)
    # A number it does not hold, among them: KeyError, as value_at.
    absent = data.draw(st.sampled_from([min(held) - 1, max(held) + 1] + [s + 1 for s in held if s + 1 not in held]))
    position = data.draw(st.integers(min_value=0, max_value=len(wanted)))
    with pytest.raises(KeyError):
        _value_at_each(index, [absent])
    with pytest.raises(KeyError):
        index.first_rows(wanted[:position] + [absent] + wanted[position:])


# Numbers held with 1 to 3 entries each (a coalesced batch's), sometimes one skipped.
_runs = st.lists(st.tuples(st.integers(min_value=1, max_value=3), st.booleans()), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-3, max_value=2**40), _runs, st.booleans(), st.data())
def test_first_rows_of_a_range_are_those_read_one_by_one(first, runs, one_entry_each, data):
    # first_rows reads a range of numbers as one slice where the map holds each of them;
    # its plain twin reads a number at a time. Both must give the same rows, or both
    # KeyError, for any range over or around what the map holds.
    seqs, seq = [], first
    for entries, skip_one in runs:
        if one_entry_each:  # the usual map: one entry per number, none skipped
            entries, skip_one = 1, False
        seqs += [seq] * entries
        seq += 2 if skip_one else 1
    index = SeqMap(EntryTable.from_entries([_entry(i, s) for i, s in enumerate(seqs)]), range(len(seqs)))
    low = data.draw(st.integers(min_value=first - 2, max_value=seqs[-1] + 2))
    wanted = range(low, data.draw(st.integers(min_value=low + 1, max_value=seqs[-1] + 3)))
    try:
        expected = index._first_rows_one_by_one(list(wanted))
    except KeyError:
        with pytest.raises(KeyError):
            index.first_rows(wanted)
    else:
        assert list(index.first_rows(wanted)) == expected


def _as_read_one_by_one(matches: list, name: str) -> list:
    """What first_value_columns gives, as (ranks, values) per match: each match in one block."""
    blocks = first_value_columns(matches, name)
    found = {}
    for block in blocks:
        assert len(block.columns) == len(block.ranks)
        for j, match in enumerate(block.matches):
            assert id(match) not in found
            found[id(match)] = (list(block.ranks), [column[j] for column in block.columns])
    return [found[id(match)] for match in matches]


def _first_values(matches: list, name: str) -> list:
    return [(list(match.calls), match.calls.first_values(name)) for match in matches]


def test_first_value_columns_reads_settled_calls_over_some_ranks():
    streams = {}
    for rank in range(4):
        table = EntryTable.from_entries([_entry(i, i + 1 + rank % 2) for i in range(6)])
        stream = type("Stream", (), {})()
        stream.collectives = SeqMap(table, range(6))
        streams[rank] = stream
    matches = [type("Match", (), {"calls": calls, "seq": seq})() for seq, calls in
               ((3, LazyCalls(streams, 3)), (4, LazyCalls(streams, 4, (1, 3))), (5, LazyCalls(streams, 5)),
                (3, LazyCalls(streams, 3, (2,))))]
    expected = _first_values(matches, "time_created_ns")
    assert _as_read_one_by_one(matches, "time_created_ns") == expected
    assert expected[1] == ([1, 3], [1000 + 7 * 2, 1000 + 7 * 2]) and expected[3] == ([2], [1000 + 7 * 2])
    assert len(first_value_columns(matches, "time_created_ns")) == 3  # the two over all ranks in one


JOBS = {
    "hang": dict(world_size=16, tp=2, pp=2, steps=4, timing=True, fault=Fault("hang", rank=5, group="tp", step=2)),
    "wrapped_straggler": dict(world_size=8, tp=2, pp=2, steps=6, timing=True, buffer_size=40,
                              fault=Fault("straggler", rank=3, straggler_ms=40.0)),
    # Wrapped buffers: collectives only the ranks whose buffer reaches back to them hold.
    "wrapped_hang": dict(world_size=8, tp=2, pp=2, steps=8, timing=True, buffer_size=25, lookahead=3,
                         fault=Fault("hang", rank=3, group="dp", step=5)),
    "batched_p2p": dict(world_size=16, tp=2, pp=4, steps=3, timing=True, p2p="batched",
                        fault=Fault("p2p_unmatched", rank=6, group="pp", step=1)),
    "coalesced_markers": dict(world_size=8, tp=2, pp=2, steps=4, timing=True, coalesced_events="marker",
                              p2p="mixed", fault=Fault("hang", rank=2, group="dp", step=1)),
}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_first_value_columns_of_every_collective_of_a_job_are_first_values(name):
    analysis, _ = analyse_dicts(dict(generate(**JOBS[name]).dumps), render=False)
    for result in (analysis.matches, analysis.device):
        matches = result.collectives
        assert any(m.calls.ranks is None for m in matches)  # read a column per rank
        if name == "wrapped_hang":  # collectives only some ranks' buffers still hold: read one by one
            assert any(m.calls.ranks is not None for m in matches)
        for field in ("time_created_ns", "record_id", "time_completed_ns"):
            assert _as_read_one_by_one(matches, field) == _first_values(matches, field)


def _same_values(a: list, b: list) -> bool:
    """Equal, and of the same types (an int median and a float one print apart)."""
    return a == b and [type(x) for x in a] == [type(x) for x in b]


@pytest.mark.parametrize("members", [2, 3, 4, 5, 8, 9, 128])
def test_on_times_of_a_block_are_each_collectives_on_time(members):
    """The stragglers rule's on-time arrivals, a block at a time (medians of sorted
    columns, means of the two middle ones as floats), are `_on_time` of each collective
    (statistics.median), value and type; lateness in C is the comprehension's."""
    from random import Random

    from frtrace.diagnosis.stragglers import _lateness_ms, _on_time, _on_times

    rng = Random(members)
    base = 1_700_000_000_000_000_000
    # Ties and whole-number means included: the types still have to agree.
    columns = [[base + 2 * rng.randrange(5) * 10**6 + j * 10**9 for j in range(20)] for _ in range(members)]
    expected = [_on_time(created) for created in zip(*columns)]
    assert _same_values(_on_times(columns), expected)
    for created in columns:
        assert _same_values(_lateness_ms(created, expected), [(t - o) / 1e6 for t, o in zip(created, expected)])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_on_times_of_a_jobs_blocks_are_each_collectives_on_time(name):
    from frtrace.diagnosis.stragglers import _on_time, _on_times, _recent_clean

    analysis, _ = analyse_dicts(dict(generate(**JOBS[name]).dumps), render=False)
    device = analysis.device
    clean = [m for view in device.views for m in _recent_clean(device.index.collectives_of.get(view.group.id, []), True)]
    blocks = first_value_columns([m for m in clean if len(m.calls) >= 2], "time_created_ns")
    assert blocks
    for block in blocks:
        assert _same_values(_on_times(block.columns), [_on_time(created) for created in zip(*block.columns)])
