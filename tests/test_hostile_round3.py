"""Hardening, round 3 (issue 26): budgets per file and per run, whole names, duplicates.

Each hostile input is built here. The contract, as in round 2: the hostile file costs its
own rank only (named as unreadable in one line, the rest analysed, no innocent rank
blamed), in time and memory linear in its bytes. Sizes are chosen so that the code these
tests replaced would take minutes or gigabytes; no test times anything.
"""

from __future__ import annotations

import gzip
import json
import pickle
import struct

import pytest
from helpers import assert_no_traceback, dump, entry, healthy_dumps, memo_reference_dump, pickle_text, run_cli, stderr_lines, write_job

from frtrace.load.normalise import MAX_ITEMS_PER_PICKLE_BYTE, MIN_PICKLE_BYTES_PER_ENTRY


def json_report(args) -> tuple:
    result = run_cli([*args, "--format", "json", "--workers", "1"])
    assert_no_traceback(result)
    return result, json.loads(result.stdout) if result.stdout else None


def assert_only_rank_2_lost(directory, reason: str) -> None:
    """rank_2 is named unreadable in one line with `reason`; ranks 0, 1 and 3 are analysed, and
    nobody is blamed for a job that is otherwise healthy."""
    result, report = json_report([directory])
    assert result.exit_code == 3, result.output
    assert report["inputs"]["ranks_found"] == [0, 1, 3] and report["inputs"]["ranks_missing"] == [2]
    assert report["suspect_ranks"] == []
    (line,) = stderr_lines(result)
    assert str(directory / "rank_2") in line and reason in line, line


# --------------------------------------------------------------------------- memo references (item 8)


def test_a_small_gzip_of_memo_references_costs_only_its_rank(tmp_path):
    # The repro: 1.2 KB gzip'd, half a million references to one entry (under the entry
    # limit) took 8.5 s and 619 MB, and a rank was blamed.
    data = memo_reference_dump(499_990)
    assert len(data) < 2_000
    directory = write_job(tmp_path / "job", healthy_dumps(4))
    (directory / "rank_2").write_bytes(data)
    assert_only_rank_2_lost(directory, "entries in")


def _entries_by_reference(count: int, long_get: bool) -> bytes:
    """A dump whose entries are `count` references to one entry, as BINGET or LONG_BINGET,
    padded with a string so that the pickle has room for them by size alone."""
    one_entry = pickle.dumps(entry(1), protocol=2)[2:-1]
    get = b"j" + struct.pack("<I", 1) if long_get else b"h\x01"
    padding = pickle_text("x" * (count * MIN_PICKLE_BYTES_PER_ENTRY))
    body = (b"}(" + pickle_text("version") + pickle_text("2.10") + pickle_text("padding") + padding
            + pickle_text("entries") + b"]" + one_entry + b"q\x01a(" + get * count + b"eu.")
    return b"\x80\x02" + body


@pytest.mark.parametrize("long_get", [False, True], ids=["BINGET", "LONG_BINGET"])
def test_one_entry_named_twice_is_refused_whatever_the_size(tmp_path, long_get):
    directory = write_job(tmp_path / "job", healthy_dumps(4))
    (directory / "rank_2").write_bytes(gzip.compress(_entries_by_reference(3_000, long_get)))
    assert_only_rank_2_lost(directory, "names one entry more than once")


@pytest.mark.parametrize("odd", [False, True], ids=["column_path", "entry_by_entry"])
def test_one_entry_named_twice_among_others_is_refused(tmp_path, odd):
    # Among entries of their own, one named again further on: the column path (or, with a
    # float time in one entry, the entry-by-entry path) refuses the file before reading it.
    entries = [entry(seq) for seq in range(1, 40)]
    if odd:
        entries[5]["time_created_ns"] = 1.5e18
    entries.insert(30, entries[12])
    directory = write_job(tmp_path / "job", healthy_dumps(4))
    (directory / "rank_2").write_bytes(pickle.dumps(dump(entries, ranks=range(4)), protocol=2))
    assert_only_rank_2_lost(directory, "names one entry more than once")


def _entries_sharing_a_list(count: int, field: str, length: int) -> bytes:
    """`count` entries, each a dict of its own (with its own pg_id, so the loader looks at
    every one), all naming one list of `length` items as `field`."""
    shared = [dict(entry(1)["frames"][0])] * length if field == "frames" else [[4]] * length
    base = entry(1)
    entries = [dict(base, pg_id=i, **{field: shared}) for i in range(count)]
    for record in entries:
        if field == "input_sizes":
            record["output_sizes"] = shared
    return pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries}, protocol=2)


@pytest.mark.parametrize("field", ["frames", "input_sizes"])
def test_entries_naming_one_long_list_are_refused_in_time(tmp_path, field):
    # 20,000 entries naming one list of 20,000 items: 400 million items to walk (minutes),
    # from under 2 MB of pickle.
    data = _entries_sharing_a_list(20_000, field, 20_000)
    assert len(data) * MAX_ITEMS_PER_PICKLE_BYTE < 20_000 * 20_000
    directory = write_job(tmp_path / "job", healthy_dumps(4))
    (directory / "rank_2").write_bytes(gzip.compress(data))
    assert_only_rank_2_lost(directory, "name the same lists over and over")


def test_every_group_naming_one_long_rank_list_is_refused(tmp_path):
    ranks = list(range(100_000))
    config = {str(i): {"name": str(i), "desc": "tp", "ranks": ranks} for i in range(2_000)}
    data = pickle.dumps({"version": "2.10", "pg_config": config, "pg_status": {}, "entries": [entry(1)]}, protocol=2)
    directory = write_job(tmp_path / "job", healthy_dumps(4))
    (directory / "rank_2").write_bytes(data)
    assert_only_rank_2_lost(directory, "name the same lists over and over")


def test_lists_an_honest_writer_shares_are_read(tmp_path):
    # Python's pickle shares whatever the writer's objects shared: one frames list for every
    # entry of a short job is still a dump.
    dumps = healthy_dumps(4, seqs=range(1, 201))
    for data in dumps.values():
        frames = data["entries"][0]["frames"]
        for record in data["entries"]:
            record["frames"] = frames
    directory = write_job(tmp_path / "job", dumps)
    result, report = json_report([directory])
    assert result.exit_code == 0 and report["inputs"]["ranks_found"] == [0, 1, 2, 3], result.output


# --------------------------------------------------------------------------- archives (items 1, 2, 6)

import io  # noqa: E402
import tarfile  # noqa: E402
import zipfile  # noqa: E402
import zlib  # noqa: E402

from helpers import nccl_hang_dumps  # noqa: E402

from frtrace.load.loader import load_dumps  # noqa: E402


def _dump_bytes(world: int = 4, culprit: int = 3) -> dict:
    return {rank: pickle.dumps(data, protocol=2) for rank, data in nccl_hang_dumps(world=world, culprit=culprit).items()}


def _deflated(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def _zip_by_hand(path, members: list, directory: list) -> None:
    """A zip written field by field: `members` are (name, data) stored one after another
    (deflated), `directory` the central directory's (name, index of the member whose
    bytes it points at, compressed size or None for the member's own) entries."""
    out, offsets = bytearray(), []
    for name, data in members:
        packed = _deflated(data)
        offsets.append((len(out), packed, data))
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, zlib.crc32(data), len(packed), len(data),
                           len(name.encode()), 0) + name.encode() + packed
    start = len(out)
    for name, index, size in directory:
        offset, packed, data = offsets[index]
        out += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, zlib.crc32(data),
                           size if size is not None else len(packed), len(data), len(name.encode()), 0, 0, 0, 0, 0,
                           offset) + name.encode()
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(directory), len(directory), len(out) - start, start, 0)
    path.write_bytes(bytes(out))


def test_zip_entries_sharing_one_compressed_stream_are_refused_when_listed(tmp_path):
    # The repro: 2,000 entries all pointing at one 257 KB deflate stream took 223 s and 920 MB
    # (each read inflated 64 MB). Here 300 entries at one stream of 64 MB of zeros.
    dumps = _dump_bytes()
    bomb = dumps[2] + bytes(64 * 1024**2)
    members = [(f"rank_{rank}", dumps[rank]) for rank in (0, 1, 3)] + [("rank_2", bomb)]
    directory = [(f"rank_{rank}", index, None) for index, rank in enumerate((0, 1, 3))]
    directory += [(f"job/rank_{rank}", 3, None) for rank in range(2, 302)]
    archive = tmp_path / "overlap.zip"
    _zip_by_hand(archive, members, directory)
    result, report = json_report([archive])
    assert report["inputs"]["ranks_found"] == [0, 1, 3]
    assert report["suspect_ranks"] == [3] and result.exit_code == 1  # the hang's own culprit, nobody else
    refused = [line for line in stderr_lines(result) if "overlap another member" in line]
    assert len(refused) == 300 and all(f"{archive}:job/rank_" in line for line in refused)


def test_a_member_reaching_into_the_next_one_is_refused(tmp_path):
    # Quoted overlap: the directory makes rank_0's compressed data run on over rank_1's header and data.
    dumps = _dump_bytes()
    members = [(f"rank_{rank}", dumps[rank]) for rank in range(4)]
    archive = tmp_path / "quoted.zip"
    _zip_by_hand(archive, members, [("rank_0", 0, 10**5)] + [(f"rank_{r}", r, None) for r in (1, 2, 3)])
    result, report = json_report([archive])
    lines = [line for line in stderr_lines(result) if "overlap another member" in line]
    assert {line.split(f"{archive}:")[1].split(":")[0] for line in lines} == {"rank_0", "rank_1"}, lines
    assert report["inputs"]["ranks_found"] == [2, 3]


def _bomb_zip(path, honest: dict, bombs: int, inflated: int) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for rank, data in honest.items():
            archive.writestr(f"rank_{rank}", data)
        for number in range(bombs):
            archive.writestr(f"rank_{len(honest) + number}", bytes(inflated))


def test_many_small_bombs_in_one_zip_share_one_floor(tmp_path):
    # 40 members of 8 MB of zeros (8 KB each deflated): each was allowed 64 MB, 320 MB in all
    # from a 300 KB archive. Now the archive's members share the run's 64 MB floor.
    archive = tmp_path / "bombs.zip"
    _bomb_zip(archive, _dump_bytes(), 40, 8 * 1024**2)
    result, report = json_report([archive])
    assert report["inputs"]["ranks_found"] == [0, 1, 2, 3]
    bombs = [line for line in stderr_lines(result) if "a zip bomb?" in line]
    assert len(bombs) == 40


def test_many_small_gzip_bombs_in_a_directory_share_one_floor(tmp_path):
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=4, culprit=3))
    for rank in range(4, 44):
        (directory / f"rank_{rank}").write_bytes(gzip.compress(bytes(8 * 1024**2)))
    result, report = json_report([directory])
    bombs = [line for line in stderr_lines(result) if "a gzip bomb?" in line]
    assert len(bombs) == 40 and report["inputs"]["ranks_found"] == [0, 1, 2, 3]


def _tar(path, members: list) -> None:
    mode = "w:gz" if path.name.endswith(("gz", "tgz")) else "w"
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _archive(path, members: list) -> None:
    """A .zip, .tar or .tar.gz (by its name) of `members`, (name, bytes) in that order."""
    if not path.name.endswith(".zip"):
        return _tar(path, members)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for member, data in members:
            out.writestr(member, data)


DEEP = "/".join(f"incident_2025_06_01_node{n:02d}_with_a_long_directory_name" for n in range(8))


@pytest.mark.parametrize("name", ["deep.zip", "deep.tar", "deep.tar.gz"])
def test_deep_member_paths_keep_their_rank(tmp_path, name):
    # Names over 120 characters were cut before the rank was read: "no Flight Recorder dump
    # files found", exit 2, for a .zip or .tar.gz of a normal job.
    assert len(DEEP) > 300
    members = [(f"{DEEP}/rank_{rank}", data) for rank, data in _dump_bytes().items()]
    archive = tmp_path / name
    _archive(archive, members)
    result, report = json_report([archive])
    assert result.exit_code == 1 and report["suspect_ranks"] == [3], result.output
    assert [d.path for d in load_dumps([archive]).dumps] == [f"{archive}:{DEEP}/rank_{r}" for r in range(4)]


@pytest.mark.parametrize("name", ["appended.tar", "appended.tar.gz", "appended.zip"])
def test_a_member_listed_twice_is_read_once_the_last_one(tmp_path, name):
    # A tar with a member appended (tar -r) aborted the whole run (exit 2). As tar and unzip
    # do, the last member of a name is the one read; one note says so.
    dumps = _dump_bytes()
    members = [(f"job/rank_{rank}", data) for rank, data in dumps.items()]
    members[:0] = [("job/rank_3", b"\x80\x02 an older, broken copy"), ("job/rank_0", b"\x80\x02 another")]
    archive = tmp_path / name
    if name.endswith(".zip"):
        with pytest.warns(UserWarning):  # zipfile warns of the name it writes twice
            _archive(archive, members)
    else:
        _archive(archive, members)
    result, report = json_report([archive])
    assert result.exit_code == 1 and report["suspect_ranks"] == [3], result.output
    (note,) = stderr_lines(result)
    assert note.startswith(f"frtrace: {archive}: 2 member names listed more than once") and "job/rank_0" in note
    assert "the last of each is read" in note


# --------------------------------------------------------------------------- generations (item 3)

import os  # noqa: E402
import time  # noqa: E402


def _hang_job(directory, world: int = 32, culprit: int = 7):
    dumps = {r: healthy_dumps(world, seqs=(1, 2, 3))[r] for r in range(world)}
    for rank, data in dumps.items():
        if rank != culprit:
            data["entries"].append(entry(4, state="started", retired=False))
    write_job(directory, dumps)
    hour_ago = time.time() - 3600
    for path in directory.iterdir():
        os.utime(path, (hour_ago, hour_ago))
    return directory


@pytest.mark.parametrize("seconds", [360, 240, -600], ids=["future", "4-min-ahead", "past"])
def test_one_touched_file_does_not_choose_the_generation(tmp_path, seconds):
    # The repro: `touch` one of 128 files 6 minutes into the future, and it alone was analysed
    # (127 dropped), a FAULT becoming INCONCLUSIVE. Into the past, rank 0 alone is complete.
    directory = _hang_job(tmp_path / "job")
    when = (time.time() if seconds > 0 else time.time() - 3600) + seconds
    os.utime(directory / "rank_0", (when, when))
    result, report = json_report([directory])
    assert report["status"] == "faults" and 7 in report["suspect_ranks"], result.output
    assert len(report["inputs"]["ranks_found"]) >= 31
    (note,) = report["inputs"]["notes"]
    if seconds == 360:  # later than now: not a time at all, so rank 0 is read with the rest
        assert report["inputs"]["ranks_found"] == list(range(32))
        assert note.startswith("1 dump file with a time no file can have")
    else:
        assert report["inputs"]["ranks_found"] == list(range(1, 32))
        assert "nearly every rank (31 of 32)" in note and "left out 1" in note
    # The report itself says it, in every format.
    for fmt in ("text", "markdown"):
        shown = run_cli([directory, "--format", fmt, "--workers", "1"]).stdout
        assert note[1:40] in shown.replace("\\", ""), shown[-800:]


def _tar_with_times(path, members: list) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mtime in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            info.pax_headers = {"mtime": repr(mtime)}  # what a pax header may say: any number
            tar.addfile(info, io.BytesIO(data))


def test_tar_member_times_no_file_can_have_are_ignored(tmp_path):
    dumps = _dump_bytes()
    times = {0: float("inf"), 1: -1e300, 2: time.time() - 60, 3: time.time() - 90}
    archive = tmp_path / "times.tar"
    _tar_with_times(archive, [(f"rank_{rank}", data, times[rank]) for rank, data in dumps.items()])
    result, report = json_report([archive])
    assert report["inputs"]["ranks_found"] == [0, 1, 2, 3] and report["suspect_ranks"] == [3], result.output
    assert report["inputs"]["notes"] == ["2 dump files with a time no file can have (not a number, before 1980 or "
                                         "in the future): taken as written with the newest"]


@pytest.mark.parametrize("how", ["twice", "directory and file", "link", "archive twice"])
def test_one_file_reached_twice_is_read_once(tmp_path, how):
    # The same file through two inputs (or a link beside it) aborted the run: "rank 0 has two
    # dump files: d/rank_0 and d/rank_0", exit 2. It is one file: read once, one note.
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=4, culprit=3))
    inputs = {"twice": [directory, directory], "directory and file": [directory, directory / "rank_1"],
              "link": [directory], "archive twice": [tmp_path / "job.tar"] * 2}[how]
    if how == "link":
        (directory / "rank_1.pkl").symlink_to(directory / "rank_1")
    if how == "archive twice":
        _tar(tmp_path / "job.tar", [(p.name, p.read_bytes()) for p in sorted(directory.iterdir())])
    result, report = json_report(inputs)
    assert result.exit_code == 1 and report["suspect_ranks"] == [3], result.output
    assert report["inputs"]["ranks_found"] == [0, 1, 2, 3]
    (note,) = stderr_lines(result)
    assert "reached twice (through two inputs, or a link): each read once" in note


def test_a_deep_name_is_shortened_only_where_it_is_shown(tmp_path):
    name = "/".join(["x" * 200] * 6) + "/rank_2"
    archive = tmp_path / "deep.tar"
    dumps = _dump_bytes()
    _tar(archive, [(f"rank_{r}", dumps[r]) for r in (0, 1, 3)] + [(name, b"\x80\x02 broken")])
    result, report = json_report([archive])
    assert report["inputs"]["unreadable_files"][0]["path"] == f"{archive}:{name}"  # whole, as data
    (line,) = stderr_lines(result)
    assert len(line) < 600 and line.split(": truncated")[0].endswith("xxx/rank_2") and "..." in line
