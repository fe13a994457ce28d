"""The column path must give the entries the entry-by-entry path gives, on dumps as torch writes them.

`entry_columns.columns_from_raw` reads a dump's entries a column at a time and compares
each entry's static part (group, shapes, state, stack) with an example entry of the same
op and group, interning only the rows that are their own example. These tests write
synthetic jobs to files (pickled as torch lays them out, or as JSON), read them back, and
hold the column path to `normalise._entries_one_by_one` on what real buffers hold: ring
buffers that wrapped, discovered times that are None (pickle) or 0 (JSON), durations on
some entries only, coalesced and batched P2P work, dumps without stacks, record ids out
of order, and ops whose entries vary more than a few examples cover.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frtrace.load.normalise import BatchMemo, _entries_one_by_one, _Normaliser
from frtrace.load.safe_decode import decode_dump_bytes
from frtrace.table.entry_columns import Coded, columns_from_raw, entry_table
from frtrace.testing.synth import Fault, encode_dump, generate

CI = settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))

# name -> (generate's keyword arguments, format): each a kind of buffer torch writes.
JOBS = {
    "plain": (dict(steps=3), "pickle"),
    "wrapped": (dict(steps=6, buffer_size=60), "pickle"),
    "timed": (dict(steps=3, timing=True, lookahead=1, fault=Fault("hang", rank=5, group="dp", step=2)), "pickle"),
    "timed_wrapped_json": (dict(steps=6, buffer_size=50, timing=True, lookahead=2,
                                fault=Fault("stuck", rank=1, group="tp", step=4)), "json"),
    "watchdog_times": (dict(steps=3, watchdog_ms=100), "pickle"),
    "batched_p2p": (dict(steps=3, p2p="batched", coalesced_events="marker"), "pickle"),
    "mixed_p2p_timed": (dict(steps=4, p2p="mixed", timing=True), "pickle"),
    "only_active": (dict(steps=3, only_active=True, timing=True, lookahead=1), "pickle"),
    "no_stacks": (dict(steps=3, with_frames=False, timing=True), "pickle"),
    "hang": (dict(steps=4, fault=Fault("hang", rank=3, group="tp", step=2), lookahead=1), "pickle"),
    "size_mismatch_json": (dict(steps=3, fault=Fault("size_mismatch", rank=2, group="dp", step=1)), "json"),
}


def _written_and_read(directory: Path, name: str) -> dict:
    """rank -> the raw entries of its dump, written to `directory` and decoded from there."""
    options, fmt = JOBS[name]
    job = generate(8, 2, 2, **options)
    directory.mkdir(parents=True, exist_ok=True)
    entries = {}
    for rank, dump in job.dumps.items():
        path = directory / f"nccl_trace_rank_{rank}"
        path.write_bytes(encode_dump(dump, fmt))
        raw, _encoding = decode_dump_bytes(path.read_bytes(), 1 << 30)
        entries[rank] = raw.get("entries") or []
    return entries


@functools.lru_cache(maxsize=None)
def _job_entries(name: str, directory: str) -> dict:
    return _written_and_read(Path(directory), name)


def assert_paths_agree(raw_entries: list, memo: BatchMemo = None) -> None:
    """The column path takes the entries, and gives what the entry-by-entry path gives."""
    fast_norm, slow_norm = _Normaliser(memo), _Normaliser()
    columns = columns_from_raw(raw_entries, fast_norm)
    assert columns is not None, "entries as torch writes them take the column path"
    one_by_one, dropped = _entries_one_by_one(raw_entries, slow_norm)
    assert dropped == 0
    assert tuple(entry_table(columns)) == one_by_one
    assert fast_norm.warnings == slow_norm.warnings
    for column in columns.lists:
        if isinstance(column, Coded):
            assert len(column.codes) == len(raw_entries)
            assert set(column.codes) <= set(range(len(column.table)))
        else:
            assert len(column) == len(raw_entries)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_rank_of_a_written_job_agrees(tmp_path, name):
    memo = BatchMemo()  # one per batch of files, as a loader worker keeps it
    for raw_entries in _written_and_read(tmp_path, name).values():
        if raw_entries:
            assert_paths_agree(raw_entries, memo)


def test_the_jobs_hold_what_they_are_named_for(tmp_path):
    def entries(name):
        return [e for rank_entries in _written_and_read(tmp_path / name, name).values() for e in rank_entries]

    assert all(e["record_id"] > 0 for e in _written_and_read(tmp_path / "w", "wrapped")[0][:1])
    timed = entries("timed")
    assert {e["time_discovered_started_ns"] is None for e in timed} == {True, False}
    assert {e["time_discovered_completed_ns"] is None for e in timed} == {True, False}
    assert {"duration_ms" in e for e in timed} == {True, False}
    json_completed = {e["time_discovered_completed_ns"] for e in entries("timed_wrapped_json")}
    assert 0 in json_completed and len(json_completed) > 1
    assert any(e["profiling_name"] == "nccl:coalesced" for e in entries("batched_p2p"))
    assert all("frames" not in e for e in entries("no_stacks"))


@pytest.mark.parametrize("name", ["wrapped", "timed", "batched_p2p", "timed_wrapped_json"])
def test_record_ids_out_of_order_are_sorted_as_entry_by_entry(tmp_path, name):
    for rank, raw_entries in _written_and_read(tmp_path, name).items():
        shuffled = list(raw_entries)
        random.Random(rank).shuffle(shuffled)
        assert_paths_agree(shuffled)
        assert_paths_agree(shuffled[::-1])
        assert_paths_agree(raw_entries[len(raw_entries) // 2:] + raw_entries[:len(raw_entries) // 2])


@CI
@given(data=st.data())
def test_any_order_and_any_rank_agrees(tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(JOBS)), label="job")
    per_rank = _job_entries(name, str(tmp_path_factory.getbasetemp() / "hypothesis-jobs" / name))
    raw_entries = per_rank[data.draw(st.sampled_from(sorted(per_rank)), label="rank")]
    if not raw_entries:
        return
    order = data.draw(st.permutations(range(len(raw_entries))), label="order")
    # Ties in record ids (as corrupt ids give): entries keep their file order among them.
    tied = data.draw(st.sets(st.sampled_from(range(len(raw_entries))), max_size=3), label="tied")
    entries = [dict(raw_entries[i]) for i in order]
    for position in tied:
        entries[position]["record_id"] = entries[0]["record_id"]
    assert_paths_agree(entries)


@CI
@given(data=st.data())
def test_ops_whose_entries_vary_more_than_a_few_examples_cover_agree(tmp_path_factory, data):
    # Each entry of one op and group is compared with the first such entry, and those unlike
    # it with one another for a few rounds; entries left over after that are their own
    # example. Shapes that change from entry to entry (as uneven all_to_all sizes do) take
    # every one of those routes.
    per_rank = _job_entries("timed", str(tmp_path_factory.getbasetemp() / "hypothesis-jobs" / "timed"))
    raw_entries = per_rank[data.draw(st.sampled_from(sorted(per_rank)), label="rank")]
    variants = data.draw(st.integers(1, len(raw_entries)), label="variants")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = random.Random(seed)
    entries = []
    for entry in raw_entries:
        entry = dict(entry)
        if rng.random() < 0.7:
            size = rng.randrange(variants) + 1
            entry["input_sizes"] = [[size, 8]]
            entry["output_sizes"] = [[size, 8]]
        entries.append(entry)
    assert_paths_agree(entries)
