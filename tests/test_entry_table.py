"""EntryTable keeps every value the loader normalised exactly (value and type), however
compactly it stores them: None beside ints, bools, floats, ints of any size, values
written over by a settled batch, rows taken out, and a trip through a pipe."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frtrace.load.normalise import normalised_without_entries, parse_profiling_name, set_entries
from frtrace.load.safe_decode import decode_dump_bytes
from frtrace.model import Entry, Frame, OpName, Shapes
from frtrace.table.batches import batch_settlements, settle_table_batches
from frtrace.table.entry_columns import entry_table
from frtrace.table.entry_table import EntryTable
from frtrace.testing.synth import Fault, encode_dump, generate

_NAMES = [OpName("nccl:all_reduce", "nccl", "all_reduce", False), OpName("nccl:send 0->1", "nccl", "send", True, 0, 1),
          OpName("nccl:coalesced", "nccl", "coalesced", False, is_coalesced_marker=True)]
_SHAPES = [Shapes(((4,),), ("Float",), ((4,),), ("Float",)), Shapes((), (), (), (), False)]
_FRAMES = [(), (Frame("f", "a.py", 1), Frame("g", "b.py", 2))]

# Values at and around the edges of every array the table may choose, and the sentinels it uses for None.
_EDGE_INTS = [0, 1, -1, 127, -127, -128, 128, 32767, -32768, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, -(2**63),
              -(2**63) + 1, 2**64, -(2**70)]
_ints = st.one_of(st.sampled_from(_EDGE_INTS), st.integers())
_maybe_ints = st.one_of(st.none(), _ints)
_maybe_floats = st.one_of(st.none(), st.floats(allow_nan=False), st.sampled_from([float("-inf"), -0.0, 0.0]))


@st.composite
def entries(draw):
    count = draw(st.integers(min_value=1, max_value=40))
    rows = []
    for index in range(count):
        rows.append(Entry(
            draw(st.sampled_from([index, index + 1000, index * 7])), draw(_ints), draw(st.sampled_from(["0", "1", ""])),
            draw(st.sampled_from(["default_pg", "tp"])), draw(st.one_of(_ints, st.just(0))), draw(_ints), draw(_ints),
            draw(_ints), draw(st.sampled_from(_NAMES)), draw(st.sampled_from(_SHAPES)),
            draw(st.sampled_from(["scheduled", "started", "completed"])), draw(st.one_of(st.none(), st.booleans())),
            draw(_ints), draw(_maybe_ints), draw(_maybe_ints), draw(_maybe_floats), draw(_maybe_ints),
            draw(st.sampled_from(_FRAMES))))
    return rows


def _same(left, right) -> bool:
    """Equal, and of the same types field by field (True == 1 == 1.0 would pass ==)."""
    return list(left) == list(right) and all(
        [type(v) for v in a] == [type(v) for v in b] for a, b in zip(left, right))


@settings(max_examples=200, deadline=None)
@given(entries())
def test_table_gives_back_exactly_what_it_was_given(rows):
    table = EntryTable.from_entries(rows)
    assert len(table) == len(rows)
    assert _same(tuple(table), rows)
    assert _same([table[i] for i in range(len(rows))], rows)
    assert _same(table[1::2], rows[1::2])
    assert _same(tuple(pickle.loads(pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL))), rows)


@settings(max_examples=200, deadline=None)
@given(entries(), entries(), st.data())
def test_rows_written_over_and_taken_out_read_back_exactly(rows, others, data):
    table = EntryTable.from_entries(rows)
    expected = list(rows)
    for other in others[: len(rows)]:
        row = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
        replacement = other._replace(index=expected[row].index)
        table.replace({row: replacement})
        expected[row] = replacement
    assert _same(tuple(table), expected)
    table.compact()
    assert _same(tuple(table), expected)
    taken = data.draw(st.lists(st.integers(min_value=0, max_value=len(rows) - 1), max_size=10))
    assert _same(tuple(table.take(taken)), [expected[i] for i in taken])


@settings(max_examples=200, deadline=None)
@given(entries(), entries(), st.data())
def test_the_static_rows_in_use_follow_writes_and_cross_processes(rows, others, data):
    # statics_in_use is kept once found, and travels with a pickled table (a loader
    # worker finds it): every write must drop it, and what arrives must be the sender's.
    table = EntryTable.from_entries(rows)
    expected = list(rows)
    assert table.statics_in_use() == EntryTable.from_entries(expected).statics_in_use()
    for other in others[: len(rows)]:
        row = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
        replacement = other._replace(index=expected[row].index)
        table.replace({row: replacement})
        expected[row] = replacement
        assert table.statics_in_use() == EntryTable.from_entries(expected).statics_in_use()
    arrived = pickle.loads(pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL))
    assert arrived.statics_in_use() == EntryTable.from_entries(expected).statics_in_use()
    assert list(dict.fromkeys(static.name for static in arrived.statics_in_use())) == arrived.static_values("name")


def test_a_healthy_ranks_entries_take_a_few_bytes_each():
    rows = [Entry(i, i, "0", "default_pg", 0, i + 1, 0, i + 1, _NAMES[0], _SHAPES[0], "completed", True,
                  1_761_000_000_000_000_000 + 1000 * i, None, None, None, 600000, _FRAMES[1]) for i in range(2000)]
    table = EntryTable.from_entries(rows)
    # codes (2) + pg_id (1) + two sequence numbers (2 each) + retired (1) + time created (8)
    assert table.nbytes() <= 20 * len(rows)
    assert _same(tuple(table), rows)


@pytest.mark.parametrize("p2p", ["batched", "mixed"])
@pytest.mark.parametrize("timing", [False, True])
def test_batches_settle_alike_on_the_table_and_on_entry_tuples(p2p, timing):
    # The loader settles batches reading the table's columns; the same rule over Entry
    # tuples must give the same entries (ops of a batch recorded `scheduled`, with no
    # events of their own, take their marker's state; P2P batch markers become P2P).
    job = generate(8, 2, 2, steps=4, timing=timing, p2p=p2p, coalesced_events="marker", buffer_size=60,
                   fault=Fault("hang", rank=3, group="pp", step=3))
    for rank, dump in sorted(job.dumps.items()):
        raw, encoding = decode_dump_bytes(encode_dump(dump, "pickle"), 1 << 30)
        loaded, columns = normalised_without_entries(raw, rank, "rank", encoding)
        set_entries(loaded, columns)
        plain = tuple(entry_table(columns))
        changes = batch_settlements(plain)
        assert changes, "the job has batches whose ops are only scheduled"
        assert _same(tuple(loaded.entries), [changes.get(i, e) for i, e in enumerate(plain)])


def test_a_batch_marker_whose_ops_fell_off_the_buffer_is_no_collective():
    # A P2P batch's end marker carries the number of its group's last collective; once the
    # ring buffer overwrote its ops, nothing shows what it ended. As its group's oldest
    # entry it is filed as no collective; a marker of a batch whose ops are held is
    # settled as ever, and one after other entries of its group is left as it is.
    marker = parse_profiling_name("nccl:coalesced")
    send = parse_profiling_name("nccl:send 0->1", True)
    shapes = Shapes((), (), (), ())

    def entry(index, name, pg, p2p_seq, state="completed"):
        return Entry(index=index, record_id=100 + index, pg_name=pg, pg_desc="pp", pg_id=1, collective_seq_id=2,
                     p2p_seq_id=p2p_seq, op_id=index, name=name, shapes=shapes, state=state,
                     retired=None if state == "scheduled" else True,
                     time_created_ns=index, time_started_ns=None, time_completed_ns=None, duration_ms=None,
                     timeout_ms=600000, frames=())

    entries = (entry(0, marker, "9", 65), entry(1, send, "9", 66, "scheduled"), entry(2, marker, "9", 66),
               entry(3, marker, "5", 7))
    changes = batch_settlements(entries)
    assert changes[0].name.is_p2p and changes[2].name.is_p2p  # the orphan and the batch's own marker
    assert changes[1].state == "completed"  # the held op takes its marker's state
    assert changes[3].name.is_p2p  # group 5's oldest entry too
    assert batch_settlements(entries[1:3] + (entry(3, marker, "9", 67),)).get(2) is None  # not its group's oldest
    table = EntryTable.from_entries(list(entries))
    settle_table_batches(table)
    assert [e.name.is_p2p for e in table] == [changes.get(i, e).name.is_p2p for i, e in enumerate(entries)]
