"""The column-at-a-time fast path must give exactly what the entry-by-entry path gives.

The loader normalises a dump's entries a whole column at a time when every field holds
what torch writes (frtrace/table/entry_columns.py), and falls back on checking entry by entry
otherwise. These tests hold the two paths to the same entries and the same warnings, on
real gloo dumps, on synthetic NCCL dumps, and on generated entries with odd values, and
check that real dumps do take the fast path. They also round-trip the packed form that
loader workers send to the parent.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
from helpers import FIXTURES, write_synth_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import _drop_missing, _entries, plausible, safe_scalars

from frtrace.load.loader import load_dumps, load_one
from frtrace.load.normalise import _entries_one_by_one, _Normaliser
from frtrace.load.safe_decode import decode_dump_bytes
from frtrace.model import Entry, Frame
from frtrace.table.entry_columns import Coded, columns_from_entries, columns_from_raw, entry_table
from frtrace.table.entry_table import EntryTable
from frtrace.testing.synth import Fault, encode_dump, generate

CI = settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))


def both_paths(raw_entries: list):
    """(columns from the fast path or None, columns entry by entry, the two warning counters)."""
    fast_norm, slow_norm = _Normaliser(), _Normaliser()
    fast = columns_from_raw(raw_entries, fast_norm)
    entries, _dropped = _entries_one_by_one(raw_entries, slow_norm)
    return fast, columns_from_entries(entries), fast_norm.warnings, slow_norm.warnings


def assert_same(raw_entries: list, must_be_fast: bool = False) -> None:
    fast, slow, fast_warnings, slow_warnings = both_paths(raw_entries)
    if must_be_fast:
        assert fast is not None
    if fast is not None:
        assert tuple(entry_table(fast)) == tuple(entry_table(slow))
        assert fast_warnings == slow_warnings


def _dump_files() -> list:
    return sorted(path for path in FIXTURES.glob("*/rank_*") if path.is_file())


@pytest.mark.parametrize("path", _dump_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_dumps_take_the_fast_path_and_agree(path: Path):
    raw, _encoding = decode_dump_bytes(path.read_bytes(), 1 << 30)
    entries = raw.get("entries") if isinstance(raw, dict) else None
    if not entries:
        pytest.skip("no entries in this dump")
    assert_same(entries, must_be_fast=True)


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("timing", [False, True])
def test_synthetic_nccl_dumps_take_the_fast_path_and_agree(fmt, timing):
    job = generate(8, 2, 2, steps=3, timing=timing, lookahead=1, buffer_size=40,
                   fault=Fault("hang", rank=3, group="tp", step=2))
    for rank in (0, 3, 7):
        raw, _ = decode_dump_bytes(encode_dump(job.dumps[rank], fmt), 1 << 30)
        assert_same(raw["entries"], must_be_fast=True)


def test_unsorted_record_ids_are_sorted_with_ties_in_file_order():
    job = generate(4, 2, 1, steps=2)
    raw, _ = decode_dump_bytes(encode_dump(job.dumps[1], "pickle"), 1 << 30)
    entries = raw["entries"]
    entries.reverse()
    entries[0]["record_id"] = entries[1]["record_id"]  # a tie
    fast, slow, _, _ = both_paths(entries)
    assert fast is not None and tuple(entry_table(fast)) == tuple(entry_table(slow))
    record_ids = list(fast.lists[1])
    assert record_ids == sorted(record_ids)


def test_odd_values_are_judged_as_the_entry_by_entry_path_judges_them():
    job = generate(4, 2, 1, steps=2)
    raw, _ = decode_dump_bytes(encode_dump(job.dumps[0], "pickle"), 1 << 30)
    for field, odd in [("collective_seq_id", None), ("record_id", [7]), ("input_sizes", 3),
                       ("duration_ms", math.nan), ("profiling_name", 3), ("time_created_ns", 2**70),
                       ("retired", 1), ("state", 5), ("frames", "oops"), ("process_group", ())]:
        entries = [dict(entry) for entry in raw["entries"]]
        entries[2][field] = odd
        fast, slow, fast_warnings, slow_warnings = both_paths(entries)
        assert slow_warnings, field  # the slow path says what it found
        if field == "frames":  # a stack that is not a list is looked up as usual, and warned about
            assert tuple(entry_table(fast)) == tuple(entry_table(slow))
            assert fast_warnings == slow_warnings
        else:
            assert fast is None, field


# Each int array width's edges: its lowest value is kept for None, so a column holding it
# must go one width up; past 64 bits no width holds it, and the entry-by-entry path takes
# the dump.
_WIDTH_EDGES = [0, 127, 128, -127, -128, -129, 32767, 32768, -32767, -32768, -32769, 2**31 - 1, 2**31,
                -(2**31) + 1, -(2**31), -(2**31) - 1, 2**63 - 1, -(2**63) + 1, -(2**63), 2**63, -(2**63) - 1]


@pytest.mark.parametrize("field", ["record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id",
                                   "time_created_ns"])
def test_int_fields_at_every_width_edge_keep_their_values(field):
    job = generate(4, 2, 1, steps=2)
    raw, _ = decode_dump_bytes(encode_dump(job.dumps[0], "pickle"), 1 << 30)
    for edge in _WIDTH_EDGES:
        entries = [dict(entry) for entry in raw["entries"]]
        entries[-1][field] = edge
        fast, slow, _, _ = both_paths(entries)
        if not -(2**63) <= edge < 2**63:  # no array holds it: the entry-by-entry path judges it
            assert fast is None, (field, edge)
            continue
        assert fast is not None, (field, edge)
        table = entry_table(fast)
        assert tuple(table) == tuple(entry_table(slow)), (field, edge)
        assert edge in table.field_at(field, range(len(entries))), (field, edge)  # sorted by record_id


# Entries that are mostly what torch writes (so the fast path is tried), sometimes with an
# odd value in any field (so it must notice and step aside).
mostly_plausible = st.lists(
    st.one_of(
        st.fixed_dictionaries({name: plausible[name] for name in plausible if name != "seq_id"}),
        _entries(safe_scalars),
    ),
    min_size=1, max_size=8,
)


@CI
@given(raw_entries=mostly_plausible)
def test_generated_entries_give_the_same_result_on_both_paths(raw_entries):
    assert_same([_drop_missing(entry) for entry in raw_entries])


def test_a_stack_is_known_by_the_frames_it_holds_not_only_by_their_identity():
    frame = {"name": "f", "filename": "a.py", "line": 1}
    entries = [
        {**_plain_entry(0), "frames": [frame]},
        {**_plain_entry(1), "frames": [dict(frame)]},  # an equal, fresh dict (as JSON gives)
    ]
    fast, _slow, _, _ = both_paths(entries)
    stacks = [entry.frames for entry in tuple(entry_table(fast))]
    assert stacks[0] == (Frame("f", "a.py", 1),) and stacks[0] is stacks[1]


def _plain_entry(record_id: int) -> dict:
    return {"record_id": record_id, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": record_id,
            "p2p_seq_id": 0, "op_id": record_id, "profiling_name": "nccl:all_reduce", "is_p2p": False,
            "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
            "state": "completed", "retired": True, "time_created_ns": 10 + record_id,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "timeout_ms": 600000}


def test_tables_come_back_equal_through_a_pipe():
    frames = (Frame("f", "a.py", 1),)
    entries = (
        Entry(0, 5, "0", "pg", 0, 1, 0, 1, None, None, "completed", True, -(2**63) + 1, None, 0, 1.5, None, frames),
        Entry(1, 2**64 - 1, "0", "pg", 0, 2, 0, 2, None, None, "started", None, 2**63 - 1, 7, None, None, 10, ()),
        Entry(2, 3, "0", "pg", 0, 3, 0, 3, None, None, "started", None, 5, 7, None, 0.25, 10, frames),
    )
    assert _through_a_pipe(entry_table(columns_from_entries(entries))) == entries


def test_fast_path_tables_come_back_as_the_same_entries_through_a_pipe():
    job = generate(8, 2, 2, steps=3, timing=True, fault=Fault("hang", rank=3, group="tp", step=2))
    raw, _ = decode_dump_bytes(encode_dump(job.dumps[3], "pickle"), 1 << 30)
    columns = columns_from_raw(raw["entries"], _Normaliser())
    assert any(isinstance(column, Coded) for column in columns.lists)
    one_by_one = _entries_one_by_one(raw["entries"], _Normaliser())[0]
    assert _through_a_pipe(entry_table(columns)) == one_by_one


def _through_a_pipe(table: EntryTable) -> tuple:
    # As a worker sends it to the main process (pickled by multiprocessing).
    return tuple(pickle.loads(pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL)))


def test_workers_and_in_process_loading_agree(tmp_path):
    job = generate(16, 2, 2, steps=3, timing=True, fault=Fault("hang", rank=5, group="dp", step=2))
    write_synth_job(tmp_path, job)
    one = load_dumps([tmp_path], workers=1)
    two = load_dumps([tmp_path], workers=2)
    assert [d.entries for d in one.dumps] == [d.entries for d in two.dumps]
    assert [d.entries for d in one.dumps] == [load_one(d.rank, d.path).entries for d in one.dumps]


@pytest.mark.parametrize("workers", [1, 2])
def test_entries_are_held_as_columns_of_machine_words(tmp_path, workers):
    # An Entry tuple and its ints cost some 300 bytes; the loader keeps each rank's
    # entries as columns, one code for the static part and one word per other field.
    job = generate(16, 2, 2, steps=40)
    write_synth_job(tmp_path, job)
    loaded = load_dumps([tmp_path], workers=workers)
    for dump in loaded.dumps:
        assert dump.entries.nbytes() <= 100 * len(dump.entries)
    at_300 = [d.entries[300] for d in loaded.dumps]
    assert len(at_300) == 16 and all(e.index == 300 for e in at_300)
    # The static parts are the objects every rank shares (the matcher compares by identity first).
    assert len({id(e.name) for e in at_300 if e.name == at_300[0].name}) == 1


# --------------------------------------------------------------------------- shared values


def _collective_facts(analysis) -> list:
    return [(m.group_id, m.seq, tuple(m.calls), m.not_issued, m.out_of_window, m.completed_ranks,
             None if m.disagreement is None else (m.disagreement.kind, m.disagreement.odd_ranks))
            for m in analysis.matches.collectives]


@pytest.mark.parametrize("fault", [None, Fault("hang", rank=5, group="tp", step=2),
                                   Fault("size_mismatch", rank=2, group="dp", step=1),
                                   Fault("extra_op", rank=6, group="tp", step=2),
                                   Fault("p2p_unmatched", rank=3, group="pp", step=2)])
def test_values_shared_across_ranks_give_the_same_matches_and_verdict(tmp_path, fault):
    # Loaded from files, equal values are one object across ranks and the matcher settles
    # most collectives by identity, a column at a time; normalised one dump at a time, they
    # are not, and it looks at every collective rank by rank. Both must agree.
    from helpers import analyse_dicts

    from frtrace.diagnosis import diagnose
    from frtrace.match.analysis import analyze

    job = generate(16, 2, 2, steps=4, timing=True, lookahead=1, fault=fault)
    write_synth_job(tmp_path, job)
    shared = analyze([tmp_path], workers=1)
    apart, apart_diagnosis = analyse_dicts({r: job.dumps[r] for r in job.dumps}, render=False)
    assert _collective_facts(shared) == _collective_facts(apart)
    diagnosis = diagnose(shared)
    assert (diagnosis.status, diagnosis.suspect_ranks) == (apart_diagnosis.status, apart_diagnosis.suspect_ranks)
    assert diagnosis.status == ("healthy" if fault is None else "faults")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stack_with_an_odd_frame_is_reported_in_every_file_that_holds_it(tmp_path, workers):
    # Stacks validated cleanly in one file are reused for the next; one with an odd frame
    # must still be validated, and reported, in each file.
    job = generate(8, 2, 2, steps=2)
    for rank in job.dumps:
        dump = job.dumps[rank]
        entries = [dict(entry) for entry in dump["entries"]]
        entries[0]["frames"] = [{"name": 7, "filename": "x.py", "line": 1}] + entries[0]["frames"]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(encode_dump({**dump, "entries": entries}, "pickle"))
    loaded = load_dumps([tmp_path], workers=workers)
    assert len(loaded.dumps) == 8
    assert all(any("frame name is not a string" in w for w in d.warnings) for d in loaded.dumps)
    assert all(d.entries[0].frames[0].name == "?" for d in loaded.dumps)


ODD_SIZES = {"bool": [[True, 8]], "float": [[1.0, 8.0]], "dict": [{1: 0, 8: 0}]}


@pytest.mark.parametrize("odd", sorted(ODD_SIZES))
@pytest.mark.parametrize("path", ["columns", "entry_by_entry"])
def test_odd_sizes_equal_to_sizes_validated_in_an_earlier_file_are_reported(tmp_path, odd, path):
    # Shape records validated cleanly in one file are reused for the next files of a batch,
    # looked up by their raw values: [[True, 8]], [[1.0, 8.0]] and [{1: 0, 8: 0}] make the
    # key [[1, 8]] makes, but only [[1, 8]] is a list of shapes.
    job = generate(8, 2, 2, steps=2)
    for rank, dump in job.dumps.items():
        entries = [dict(entry) for entry in dump["entries"]]
        entries[0]["input_sizes"] = [[1, 8]] if rank == 0 else ODD_SIZES[odd]
        if path == "entry_by_entry" and rank:
            entries[1]["time_created_ns"] = float(entries[1]["time_created_ns"])
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(encode_dump({**dump, "entries": entries}, "pickle"))
    loaded = load_dumps([tmp_path], workers=1)
    assert len(loaded.dumps) == 8
    assert [any("input_sizes is not a list of shapes" in w for w in d.warnings) for d in loaded.dumps] == \
        [d.rank != 0 for d in loaded.dumps]


@pytest.mark.parametrize("workers", [1, 2])
def test_every_rank_list_is_kept_once(tmp_path, workers):
    # Each rank lists the whole world in its default group; one tuple must serve them all.
    job = generate(16, 2, 2, steps=2)
    write_synth_job(tmp_path, job)
    loaded = load_dumps([tmp_path], workers=workers)
    world = [config.ranks for d in loaded.dumps for config in d.pg_config if config.desc == "default_pg"]
    assert len(world) == 16 and world[0] == tuple(range(16)) and all(ranks is world[0] for ranks in world)
    tp_lists = {config.ranks for d in loaded.dumps for config in d.pg_config if config.desc == "tp"}
    assert tp_lists == {(r, r + 1) for r in range(0, 16, 2)}
    # DP groups (every 4th rank here) travel from the workers as ranges, and arrive as tuples.
    dp_lists = {config.ranks for d in loaded.dumps for config in d.pg_config if config.desc == "dp"}
    assert dp_lists == {tuple(range(r, 16, 4)) for r in range(4)}


@pytest.mark.parametrize("ranks, travels_as", [
    ((0, 1, 2, 3), range(4)), ((3, 35, 67), range(3, 68, 32)), ((7,), range(7, 8)),
    ((0, 2, 3, 6), None), ((0, 32, 65), None), ((1, 3, 5, 6), None),
])
def test_a_rank_list_travels_as_a_range_only_when_it_is_one(ranks, travels_as):
    from array import array

    from frtrace.load.loader import _packed_ranks

    packed = _packed_ranks(ranks, {})
    assert packed == travels_as if travels_as is not None else isinstance(packed, array)
    assert tuple(packed) == ranks


@pytest.mark.parametrize("splits", ["on-all_to_all-only", "on-every-entry", "odd-values"])
def test_all_to_all_split_sizes_take_the_fast_path_and_agree(splits):
    """Dump format 2.11 gives an all_to_all's element counts per peer: part of its shapes."""
    job = generate(8, 2, 2, steps=2)
    raw, _ = decode_dump_bytes(encode_dump(job.dumps[0], "pickle"), 1 << 30)
    entries = raw["entries"]
    for k, e in enumerate(entries):
        if splits != "on-all_to_all-only" or "all_to_all" in e["profiling_name"]:
            e["input_split_sizes"], e["output_split_sizes"] = [k, 2, 3, 4], [4, 3, 2, k]
        if splits == "odd-values" and k % 3 == 0:
            e["input_split_sizes"], e["output_split_sizes"] = ["x"], None
    assert_same(entries, must_be_fast=True)
    fast, _, _, warnings = both_paths(entries)
    shapes = {s for s in entry_table(fast).field("shapes") if s.input_split_sizes}
    assert shapes and all(len(s.input_split_sizes) == 4 for s in shapes)
    assert ("input_split_sizes is not a list of element counts" in warnings) == (splits == "odd-values")


def test_a_bare_dtype_name_is_read_as_every_tensor_s_dtype():
    job = generate(4, 2, 1, steps=1)
    raw, _ = decode_dump_bytes(encode_dump(job.dumps[0], "pickle"), 1 << 30)
    entries = raw["entries"]
    for e in entries:
        e["input_dtypes"] = e["input_dtypes"][0] if e["input_dtypes"] else ""
    fast, slow, _, warnings = both_paths(entries)
    assert fast is None and not warnings  # the entry-by-entry path reads it, without a warning
    original, _ = decode_dump_bytes(encode_dump(job.dumps[0], "pickle"), 1 << 30)
    for read, written in zip(entry_table(slow), original["entries"]):
        assert list(read.shapes.input_dtypes) == written["input_dtypes"]
