"""Dumps read from archives (.tar, .tar.gz/.tgz, .zip) as streams: the same report as the
directory, and hostile members (`..`, absolute names, links, oversized, zip bombs) each
refused in one line naming the member while the rest is analysed."""

from __future__ import annotations

import io
import json
import pickle
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import nccl_hang_dumps, run_cli, stderr_lines, write_job

from frtrace.load.loader import load_dumps

ARCHIVES = ("dumps.tar", "dumps.tar.gz", "dumps.tgz", "dumps.zip")


def _dump_bytes() -> dict:
    return {rank: pickle.dumps(data, protocol=2) for rank, data in nccl_hang_dumps(world=4, culprit=3).items()}


def _tar(path: Path, members: list) -> Path:
    """members: (TarInfo, bytes or None)."""
    mode = "w:gz" if path.name.endswith(("gz", "tgz")) else "w"
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _regular(name: str, data: bytes):
    return tarfile.TarInfo(name), data


def _write_archive(path: Path, files: dict) -> Path:
    if path.suffix == ".zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in files.items():
                archive.writestr(name, data)
        return path
    return _tar(path, [_regular(name, data) for name, data in files.items()])


def _report(args) -> tuple:
    result = run_cli([*args, "--format", "json"])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else None, result


@pytest.mark.parametrize("name", ARCHIVES)
def test_archive_gives_the_report_of_the_directory(tmp_path, name):
    files = {f"job/rank_{rank}": data for rank, data in _dump_bytes().items()}
    plain = write_job(tmp_path / "plain", nccl_hang_dumps(world=4, culprit=3))
    archive = _write_archive(tmp_path / name, files)
    code_dir, report_dir, _ = _report([plain])
    code, report, result = _report([archive])
    # each rank's dump file says where it was read: the archive member, not the directory
    assert report["inputs"].pop("dump_files") == [{"rank": r, "path": f"{archive}:job/rank_{r}"} for r in range(4)]
    report_dir["inputs"].pop("dump_files")
    assert (code, report) == (code_dir, report_dir)
    assert report["suspect_ranks"] == [3]
    assert not (tmp_path / "job").exists()  # nothing extracted
    loaded = load_dumps([archive])
    assert [d.path for d in loaded.dumps] == [f"{archive}:job/rank_{r}" for r in range(4)]


def _hostile_tar(path: Path, dumps: dict, max_member: int) -> Path:
    members = [_regular(f"rank_{rank}", data) for rank, data in dumps.items() if rank != 2]
    members.append(_regular("../rank_9", dumps[0]))
    members.append(_regular("/etc/rank_8", dumps[0]))
    link = tarfile.TarInfo("rank_7")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    members.append((link, None))
    hard = tarfile.TarInfo("logs/rank_6")
    hard.type, hard.linkname = tarfile.LNKTYPE, "rank_0"
    members.append((hard, None))
    members.append(_regular("rank_2", dumps[2] + b"\0" * max_member))  # over the cap
    return _tar(path, members)


@pytest.mark.parametrize("name", ("hostile.tar", "hostile.tar.gz"))
def test_hostile_tar_members_are_refused_in_one_line_each_and_the_rest_analysed(tmp_path, name):
    dumps = _dump_bytes()
    cap = max(len(d) for d in dumps.values()) + 1000
    archive = _hostile_tar(tmp_path / name, dumps, cap)
    result = run_cli([archive, "--format", "json", "--max-file-size", str(cap)])
    report = json.loads(result.stdout)
    lines = stderr_lines(result)
    expected = {
        "../rank_9": "leaves the archive",
        "/etc/rank_8": "absolute member name",
        "rank_7": "symbolic link to '/etc/passwd': links are not followed",
        "logs/rank_6": "hard link to 'rank_0': links are not followed",
        "rank_2": "over the",
    }
    for member, reason in expected.items():
        named = [line for line in lines if f"{archive}:{member}:" in line]
        assert len(named) == 1 and reason in named[0], (member, lines)
    # rank 2's dump is unreadable: evidence, as for a plain file over --max-file-size; the rest is analysed
    assert report["inputs"]["ranks_found"] == [0, 1, 3]
    assert 2 in report["inputs"]["ranks_missing"]
    assert result.exit_code in (1, 3)
    assert not list(tmp_path.glob("etc*")) and not (tmp_path.parent / "rank_9").exists()


def test_zip_bomb_member_and_zip_links_are_refused(tmp_path):
    dumps = _dump_bytes()
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for rank in (0, 1, 3):
            zf.writestr(f"rank_{rank}", dumps[rank])
        # 80 MB of zeros deflate to about 80 KB: a ratio of 1,000, past the 64 MB floor
        zf.writestr("rank_2", dumps[2] + b"\0" * (80 * 1024**2))
        link = zipfile.ZipInfo("rank_5")
        link.create_system, link.external_attr = 3, (0o120777 << 16)
        zf.writestr(link, "/etc/passwd")
        zf.writestr("../rank_4", dumps[0])
    result = run_cli([archive, "--format", "json"])
    lines = stderr_lines(result)
    (bomb,) = [line for line in lines if f"{archive}:rank_2:" in line]
    assert "zip bomb" in bomb
    assert any(f"{archive}:rank_5:" in line and "links are not followed" in line for line in lines)
    assert any(f"{archive}:../rank_4:" in line and "leaves the archive" in line for line in lines)
    report = json.loads(result.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1, 3]


def test_gzip_bomb_tarball_stops_reading_with_one_line(tmp_path):
    dumps = _dump_bytes()
    archive = tmp_path / "bomb.tgz"
    members = [_regular(f"rank_{rank}", dumps[rank]) for rank in (0, 1, 2, 3)]
    members.insert(2, _regular("filler", b"\0" * (80 * 1024**2)))  # deflates to ~80 KB: past the 64 MB floor
    _tar(archive, members)
    result = run_cli([archive, "--format", "json"])
    lines = stderr_lines(result)
    assert any(line.startswith(f"frtrace: skipped {archive}: decompresses to more than") and "bomb" in line
               for line in lines), lines
    report = json.loads(result.stdout)
    assert report["inputs"]["ranks_found"] == [0, 1]  # what came before the bomb is analysed


def test_corrupt_archive_is_one_line_exit_2(tmp_path):
    archive = tmp_path / "broken.zip"
    archive.write_bytes(b"PK\x03\x04" + b"\xff" * 100)
    result = run_cli([archive])
    assert result.exit_code == 2
    assert len(stderr_lines(result)) == 1 and "broken.zip" in result.stderr
