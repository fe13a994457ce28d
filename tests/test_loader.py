import gzip
import pickle

import pytest
from helpers import FIXTURES, dump, entry, write_json, write_pickle

from frtrace.load.loader import InputError, find_dump_files, load_dumps, parse_rank_from_name
from frtrace.load.safe_decode import DecodeError, decode_dump_bytes


@pytest.mark.parametrize(
    "name, expected",
    [
        ("rank_3", ("rank_", 3)),
        ("rank_3.pkl", ("rank_", 3)),
        ("nccl_trace_rank_12.json.gz", ("nccl_trace_rank_", 12)),
        ("comm_lib_trace_rank_0", ("comm_lib_trace_rank_", 0)),
        ("_dump_7", ("_dump_", 7)),
        ("nccl_trace_rank_node02_5", ("nccl_trace_rank_node02_", 5)),
        ("host0.pci3_rank_5", ("host0.pci3_rank_", 5)),
        ("train.log", None),
    ],
)
def test_rank_comes_from_the_file_name(name, expected):
    assert parse_rank_from_name(name) == expected


def test_host_qualified_names_form_one_family_and_unrelated_files_are_skipped(tmp_path):
    for host, rank in [("node00", 0), ("node00", 1), ("node01", 2), ("node01", 3)]:
        write_pickle(tmp_path / f"nccl_trace_rank_{host}_{rank}", dump([entry(1)]))
    (tmp_path / "core.123").write_bytes(b"\x7fELF")
    (tmp_path / "train.log").write_text("hello")
    files, skipped, prefix = find_dump_files([tmp_path])
    assert [rank for rank, _ in files] == [0, 1, 2, 3]
    assert sorted(p.path.rsplit("/", 1)[-1] for p in skipped) == ["core.123", "train.log"]
    assert prefix == "nccl_trace_rank_nodeN_"


def test_two_files_for_one_rank_is_an_error_naming_both(tmp_path):
    write_pickle(tmp_path / "rank_0", dump([entry(1)]))
    write_json(tmp_path / "rank_0.json", dump([entry(1)]))
    with pytest.raises(InputError) as err:
        find_dump_files([tmp_path])
    assert "rank_0.json" in str(err.value) and "rank_0 " in str(err.value) + " "


def test_pickle_json_and_gzip_normalise_to_the_same_entries(tmp_path):
    data = dump([entry(1), entry(2, "broadcast")])
    write_pickle(tmp_path / "rank_0", data)
    json_data = dict(data, entries=[dict(e, process_group=list(e["process_group"]), frames=[]) for e in data["entries"]])
    write_json(tmp_path / "rank_1", json_data)
    (tmp_path / "rank_2.gz").write_bytes(gzip.compress(pickle.dumps(data, protocol=2)))
    result = load_dumps([tmp_path])
    assert [d.encoding for d in result.dumps] == ["pickle", "json", "pickle+gzip"]
    ops = {tuple((e.op, e.collective_seq_id, e.pg_name) for e in d.entries) for d in result.dumps}
    assert ops == {(("all_reduce", 1, "0"), ("broadcast", 2, "0"))}


def test_old_versions_and_odd_fields_become_warnings_not_crashes(tmp_path):
    old = {"version": "2.0", "entries": [
        {"record_id": 0, "pg_id": 0, "process_group": ["0", ""], "seq_id": 1, "profiling_name": "nccl:all_reduce",
         "input_sizes": "oops", "time_created_ns": 5, "state": "completed"},
        "not an entry",
    ]}
    write_pickle(tmp_path / "rank_0", old)
    write_pickle(tmp_path / "rank_1", [entry(1, backend="xccl")])  # bare list: oldest producers
    result = load_dumps([tmp_path])
    first, second = result.dumps
    assert [e.collective_seq_id for e in first.entries] == [1]
    assert any("input_sizes" in w for w in first.warnings) and any("not a dict" in w for w in first.warnings)
    assert second.entries[0].name.backend == "xccl"


class _Boom:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned > /tmp/frtrace_pwned",))


def test_a_pickle_with_a_reduce_call_is_refused_and_runs_nothing(tmp_path):
    hostile = pickle.dumps({"version": "2.10", "entries": [_Boom()]}, protocol=2)
    with pytest.raises(DecodeError, match="posix.system|os.system"):
        decode_dump_bytes(hostile, 10**6)
    write_pickle(tmp_path / "rank_0", dump([entry(1)]))
    (tmp_path / "rank_1").write_bytes(hostile)
    result = load_dumps([tmp_path])
    assert [d.rank for d in result.dumps] == [0]
    assert result.errors[0].path.endswith("rank_1") and "refused" in result.errors[0].problem
    assert result.failed_ranks == (1,)
    import os
    assert not os.path.exists("/tmp/frtrace_pwned")


@pytest.mark.parametrize("payload, problem", [
    (b"", "empty file"),
    (b"\x80\x02}q\x00(X", "truncated or corrupt pickle"),
    (b"{not json", "invalid JSON"),
    (b"GIF89a....", "not a Flight Recorder dump"),
    (b"\x1f\x8b\x08\x00garbage", "corrupt gzip"),
])
def test_broken_files_name_the_problem(payload, problem):
    with pytest.raises(DecodeError, match=problem):
        decode_dump_bytes(payload, 10**6)


def _advice_recorder(monkeypatch):
    import os

    advised = []
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: advised.append((os.readlink(f"/proc/self/fd/{fd}"), advice)))
    return advised


def test_dumps_large_next_to_memory_leave_the_page_cache_once_read(monkeypatch):
    import os

    from frtrace.load import loader

    directory = FIXTURES / "hang_never_arrives"
    normal = load_dumps([directory])
    advised = _advice_recorder(monkeypatch)
    monkeypatch.setattr(loader, "CACHE_SHARE", 0.0)  # as if these files filled the machine
    dropped = load_dumps([directory])
    files = sorted(str(p.resolve()) for p in directory.iterdir() if p.name.startswith("rank_"))
    assert sorted(advised) == [(path, os.POSIX_FADV_DONTNEED) for path in files]
    # Nothing read differs.
    assert [(d.rank, d.entries, d.pg_config) for d in dropped.dumps] == [(d.rank, d.entries, d.pg_config) for d in normal.dumps]


def test_small_dumps_stay_in_the_page_cache(monkeypatch):
    advised = _advice_recorder(monkeypatch)
    loaded = load_dumps([FIXTURES / "hang_never_arrives"])
    assert len(loaded.dumps) == 4 and advised == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bool_frame_line_is_reported_whatever_was_read_before(tmp_path, workers):
    """A frame line True equals 1: a stack an earlier file of the batch held clean with line 1
    must not let the bool through unreported, so that what a file is told does not depend on
    which files shared its batch (one batch with 1 worker, several with 2)."""
    clean = [{"name": "step", "filename": "train.py", "line": 1}]
    odd = [{"name": "step", "filename": "train.py", "line": True}]
    for rank in (0, 1, 2, 3):
        frames = clean if rank in (0, 1) else odd
        write_pickle(tmp_path / f"nccl_trace_rank_{rank}", dump([entry(1, frames=frames), entry(2, frames=frames)]))
    loaded = load_dumps([tmp_path], workers=workers)
    warned = {d.rank for d in loaded.dumps if any("frame line is not an integer" in w for w in d.warnings)}
    assert warned == {2, 3}


@pytest.mark.parametrize("files, workers, most", [(1, 2, None), (100, 2, None), (4096, 2, None), (16384, 2, None),
                                                  (32768, 16, None), (300, 2, 64), (20000, 4, 64)])
def test_batches_hold_every_file_once_in_order_and_end_small(files, workers, most):
    from frtrace.load.loader import LARGE_JOB_BATCH_FILES, LARGE_JOB_FILES, POOL_BATCH_FILES, job_batches

    jobs = list(range(files))
    batches = job_batches(jobs, workers, most)
    assert [job for batch in batches for job in batch] == jobs
    assert len(batches[0]) == 1  # the first dump arrives after one file
    largest = max(map(len, batches))
    assert largest <= (most or (LARGE_JOB_BATCH_FILES if files >= LARGE_JOB_FILES else POOL_BATCH_FILES))
    # The workers' last batches are no longer than the pool's usual, whatever the rest hold.
    assert all(len(batch) <= POOL_BATCH_FILES for batch in batches[-workers:])
    if files >= LARGE_JOB_FILES:
        assert largest == LARGE_JOB_BATCH_FILES
