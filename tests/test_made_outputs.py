"""Files made where the analysis is (a cluster's worker) and written where the command
runs: `make_output_file` makes the very bytes `write_output` writes, `write_made_output`
puts them in place with the same checks, and the command reports each file as a local
run does, or says why it could not.

The cluster itself is stood in for here (`on_cluster` runs its function in this
process, and its files are read from this disk); tests/test_cluster.py runs the same
through a real dask cluster.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from helpers import nccl_hang_dumps, run_cli, write_job

import frtrace
from frtrace.cli import analyse
from frtrace.cli.remote import OutputRequest, ReportRequest, report_on_worker
from frtrace.cli.render import RenderOptions
from frtrace.export import outputs
from frtrace.export.outputs import OutputError, make_output_file, write_made_output, write_output
from frtrace.export.paths import DATABASE, HTML, TIMELINE, OutputTarget, plan_output

KINDS = {"db.sqlite": DATABASE, "db.pkl": DATABASE, "trace.json": TIMELINE, "trace.json.gz": TIMELINE,
         "report.html": HTML}


@pytest.fixture
def job(tmp_path):
    """A 4-rank NCCL hang: rank 3 never issues all_reduce #4 of group 0."""
    return write_job(tmp_path / "dumps", nccl_hang_dumps())


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The folder make_output_file's temporary files go to, to see them gone."""
    folder = tmp_path / "private"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("name", sorted(KINDS))
def test_made_bytes_are_the_bytes_written_here(job, tmp_path, private_tmp, name):
    analysis = frtrace.analyze(job)
    diagnosis = frtrace.diagnose(analysis).outcome
    written = write_output(tmp_path / name, KINDS[name], analysis, diagnosis)
    made_at = make_output_file(plan_output(tmp_path / ("made-" + name), KINDS[name], force=False), analysis, diagnosis)
    made = Path(made_at).read_bytes()
    assert made == written.read_bytes() and len(made) > 100
    assert [p.name for p in private_tmp.iterdir()] == [Path(made_at).name]
    target = plan_output(tmp_path / ("again-" + name), KINDS[name], force=False)
    assert write_made_output(target, [made[:100], made[100:]]).read_bytes() == made


def test_a_file_that_cannot_be_made_names_the_output_and_leaves_nothing(job, tmp_path, private_tmp, monkeypatch):
    analysis = frtrace.analyze(job)

    def broken(path_tmp, analysis, diagnosis):
        sqlite3.connect(path_tmp).close()
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(outputs, "write_sqlite", broken)
    target = plan_output(tmp_path / "out.sqlite", DATABASE, force=False)
    with pytest.raises(OutputError, match=r"out\.sqlite: cannot write the SQLite database \(disk I/O error\)"):
        make_output_file(target, analysis, frtrace.diagnose(analysis).outcome)
    assert list(private_tmp.iterdir()) == []


def test_made_bytes_never_replace_a_file_that_appeared_meanwhile(tmp_path):
    target = plan_output(tmp_path / "db.pkl", DATABASE, force=False)
    (tmp_path / "db.pkl").write_bytes(b"another run's")
    with pytest.raises(OutputError, match="already exists"):
        write_made_output(target, [b"ours"])
    assert (tmp_path / "db.pkl").read_bytes() == b"another run's"
    assert [p.name for p in tmp_path.iterdir()] == ["db.pkl"]


def test_the_worker_makes_each_file_and_says_why_one_was_not(job, tmp_path):
    analysis = frtrace.analyze(job)
    dump = analysis.load.dumps[0].path
    refused = OutputTarget(type(tmp_path)(dump), DATABASE, "pickle", True)  # -o at a dump, however planned
    timeline = plan_output(tmp_path / "trace.json", TIMELINE, force=False)
    request = ReportRequest("json", False, RenderOptions(), False, OutputRequest((refused, timeline)))
    remote = report_on_worker(request, analysis)
    first, second = remote.outputs
    assert first.file is None and "refusing to overwrite an input dump file" in (first.error or "")
    assert second.error is None and second.file is not None
    made = Path(second.file.path).read_bytes()
    assert second.file.size == len(made)
    assert made == write_output(tmp_path / "here.json", TIMELINE, analysis, frtrace.diagnose(analysis).outcome).read_bytes()
    assert remote.status == "faults"
    Path(second.file.path).unlink()


class FilesHere:
    """WorkerFiles for files on this disk, in pieces of 1,000 bytes; what was discarded."""

    def __init__(self) -> None:
        self.discarded: list = []

    def read(self, file):
        data = Path(file.path).read_bytes()
        return (data[start:start + 1000] for start in range(0, len(data), 1000))

    def discard(self, file) -> None:
        self.discarded.append(file.path)
        Path(file.path).unlink()


def _on_cluster_here(files: FilesHere, appear=None):
    """on_cluster run in this process; `appear` a file another run writes meanwhile."""
    def on_cluster(inputs, then, *, scheduler, progress=None, receive=None, **options):
        outcome = then(frtrace.analyze(inputs, **options))
        if appear is not None:
            appear.write_bytes(b"another run's")
        if receive is not None:
            receive(outcome, files)
        return outcome
    return on_cluster


def test_the_command_writes_what_the_worker_made_as_a_local_run(job, tmp_path, monkeypatch):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    local = run_cli([job, "--format", "json", "-o", here / "db.sqlite", "--timeline", here / "trace.json"])
    files = FilesHere()
    monkeypatch.setattr(analyse, "on_cluster", _on_cluster_here(files))
    remote = run_cli([job, "--format", "json", "--scheduler", "local:1", "-o", there / "db.sqlite",
                      "--timeline", there / "trace.json"])
    assert (remote.exit_code, remote.stdout) == (local.exit_code, local.stdout) == (1, local.stdout)
    assert remote.stderr.replace(str(there), "DIR") == local.stderr.replace(str(here), "DIR")
    assert remote.stderr.count("wrote ") == 2
    for name in ("db.sqlite", "trace.json"):
        assert (there / name).read_bytes() == (here / name).read_bytes()
    assert len(files.discarded) == 2  # nothing left behind where they were made


def test_a_file_the_command_cannot_put_in_place_is_an_error_after_the_report(job, tmp_path, monkeypatch):
    files = FilesHere()
    monkeypatch.setattr(analyse, "on_cluster", _on_cluster_here(files, appear=tmp_path / "db.sqlite"))
    result = run_cli([job, "--format", "json", "--scheduler", "local:1", "-o", tmp_path / "db.sqlite",
                      "--timeline", tmp_path / "trace.json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["suspect_ranks"] == [3]  # the report is out all the same
    assert result.stderr.splitlines()[-1] == (f"frtrace: error: {tmp_path / 'db.sqlite'}: already exists (written "
                                              "meanwhile by another run?); add --force to replace it")
    assert (tmp_path / "db.sqlite").read_bytes() == b"another run's"
    assert (tmp_path / "trace.json").stat().st_size > 0
    assert len(files.discarded) == 2


class GoneRunner:
    """A DaskRunner whose workers have all left."""

    client = None

    def worker_addresses(self) -> set:
        return set()


def test_a_file_whose_worker_left_is_one_error_naming_the_output(tmp_path):
    from frtrace.load.cluster import WorkerFile, WorkerFiles

    files = WorkerFiles(GoneRunner())  # type: ignore[arg-type]
    target = plan_output(tmp_path / "db.sqlite", DATABASE, force=False)
    with pytest.raises(OutputError) as raised:
        write_made_output(target, files.read(WorkerFile("tcp://10.0.0.9:4000", "/tmp/x", 10)))
    assert str(raised.value) == (f"{tmp_path / 'db.sqlite'}: cannot write (dask worker tcp://10.0.0.9:4000, which made "
                                 "it, has left the cluster)")
    assert list(tmp_path.iterdir()) == []
    files.discard(WorkerFile("tcp://10.0.0.9:4000", "/tmp/x", 10))  # nothing to do, and no error


class Interrupt(BaseException):
    """A stop signal arriving while a file is read back (cli.main raises one of these)."""


def test_files_made_on_a_worker_are_removed_even_when_stopped_half_way(job, tmp_path):
    from frtrace.cli.progress import Progress
    from frtrace.cli.remote import MadeOutput
    from frtrace.load.cluster import WorkerFile

    made_files = []
    for name in ("a.json", "b.json"):
        path = tmp_path / f"made-{name}"
        path.write_bytes(b"{}")
        made_files.append(MadeOutput(plan_output(tmp_path / name, TIMELINE, force=False),
                                     WorkerFile("", str(path), 2), None, None))

    class StoppedFiles(FilesHere):
        def read(self, file):
            raise Interrupt()

    files = StoppedFiles()
    with pytest.raises(Interrupt):
        analyse._write_made_outputs(tuple(made_files), files, Progress())
    assert sorted(files.discarded) == sorted(str(tmp_path / f"made-{n}") for n in ("a.json", "b.json"))
    assert not (tmp_path / "a.json").exists()
