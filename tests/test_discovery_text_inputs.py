"""discover_dump_files (exported by frtrace.load.loader) takes a local path given as text
as the loader's other entry points do: as the path it names. Text that is no URL used to
reach `.is_dir()` and crash with an AttributeError, and an archive named as text was
taken for a dump file instead of being opened."""

from __future__ import annotations

import tarfile

from helpers import nccl_hang_dumps, write_job

from frtrace.load.loader import discover_dump_files


def test_a_directory_named_as_text_is_searched_like_a_path(tmp_path):
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=4, culprit=3))

    found = discover_dump_files([str(directory)])

    assert [rank for rank, _ in found.files] == [0, 1, 2, 3]
    assert found.files == discover_dump_files([directory]).files
    assert not found.skipped and not found.refused


def test_an_archive_named_as_text_is_opened(tmp_path):
    directory = write_job(tmp_path / "job", nccl_hang_dumps(world=4, culprit=3))
    archive = tmp_path / "dumps.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(directory, arcname="job")

    found = discover_dump_files([str(archive)])

    assert [rank for rank, _ in found.files] == [0, 1, 2, 3]
    assert [str(path) for _, path in found.files] == [f"{archive}:job/rank_{rank}" for rank in range(4)]
    assert not found.refused
