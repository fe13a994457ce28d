"""Every output on one hostile job (issue 26, item 4): no raw control or bidi character
from a dump string, a file name or an archive member reaches a terminal, a browser, a
ticket, a database or a trace.

The job is a real hang (rank 3 never issues all_reduce #4) whose every string a dump
can carry holds escape sequences (screen clear, clipboard write, a forged HEALTHY
line), C1 controls, line separators and right-to-left overrides; its directory, an
unrelated file, an unreadable dump and an older generation are named the same way.
Each output is produced by the command itself, in a process of its own, and scanned.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import nccl_hang_dumps, write_job

from frtrace.wording import printable

# What must never come out raw: C0 controls but the newline, DEL, C1 controls, line and
# paragraph separators, and the bidi embeddings, overrides, isolates and marks.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Clear the screen, write the clipboard, forge a line, reverse what follows.
EVIL = "\x1b[2J\x1b]52;c;aGk=\x07\r\nHEALTHY: all fine\u2028\x9b31m\u202e\u2066x\t\x7f\x00"


def hostile_dumps() -> dict:
    dumps = nccl_hang_dumps(world=6, culprit=3)
    for data in dumps.values():
        data["version"] = "2.10" + EVIL
        data["comm_lib_version"] = "2.27" + EVIL
        for config in data["pg_config"].values():
            config["desc"] += EVIL
        for record in data["entries"]:
            record["process_group"] = (record["process_group"][0], record["process_group"][1] + EVIL)
            record["profiling_name"] += EVIL if " " not in record["profiling_name"] else ""
            record["input_dtypes"] = [d + EVIL for d in record["input_dtypes"]]
            record["output_dtypes"] = list(record["input_dtypes"])
            record["frames"] = [{"name": "step" + EVIL, "filename": "/job/train" + EVIL + ".py", "line": 7}]
        data["pg_status"] = {"x" + EVIL: {}}  # an odd field: a warning in every output
    return dumps


def hostile_job(root: Path) -> Path:
    """The job in a directory named with escapes, next to an unrelated file, an unreadable
    dump (rank 5) and an older generation of two ranks, all named with escapes too."""
    dumps = hostile_dumps()
    del dumps[5]
    directory = write_job(root / ("job" + EVIL.replace("\x00", "").replace("/", "")), dumps)
    (directory / ("notes" + EVIL.replace("\x00", "") + ".txt")).write_text("hello\n")
    (directory / "rank_5").write_bytes(b"\x80\x02X\x05\x00\x00\x00\x1b[2J\x07")  # truncated pickle
    old = directory / ("old" + EVIL.replace("\x00", ""))
    write_job(old, {r: d for r, d in hostile_dumps().items() if r < 2})
    hour_ago = time.time() - 3600
    for path in old.iterdir():
        os.utime(path, (hour_ago, hour_ago))
    return directory


def frtrace(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:surrogateescape", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "frtrace", *map(str, args)], capture_output=True, cwd=cwd,
                          env=env, timeout=300)


def assert_clean(what: str, text) -> None:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    found = sorted({repr(ch) for ch in RAW.findall(text)})
    assert not found, f"{what}: raw {', '.join(found)} in:\n{text[:3000]}"


def _sqlite_text(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        cells = [str(cell) for table in tables for row in conn.execute(f'SELECT * FROM "{table}"') for cell in row
                 if isinstance(cell, str)]
    return "\n".join(cells)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory) -> Path:
    return hostile_job(tmp_path_factory.mktemp("hostile"))


REPORTS = {
    "text": [],
    "text -v": ["-v"],
    "json": ["--format", "json"],
    "markdown": ["--format", "markdown"],
    "--ranks": ["--ranks"],
    "--ranks json": ["--ranks", "--format", "json"],
    "--ranks markdown": ["--ranks", "--format", "markdown"],
    "-j": ["-j"],
    "-j --print-stack-trace": ["-j", "--print-stack-trace"],
    "-j --per-rank": ["-j", "--per-rank", "--print-stack-trace"],
    "-j --per-rank, rendered by the workers": ["-j", "--per-rank", "--workers", "2"],
    "-j --ranks 0-3 -v": ["-j", "--selected-ranks", "0-3", "-v"],
}


@pytest.mark.parametrize("name", list(REPORTS))
def test_every_report_escapes_the_hostile_job(job_dir, name):
    run = frtrace(job_dir, "--workers", "1", *REPORTS[name]) if "--workers" not in REPORTS[name] else \
        frtrace(job_dir, *REPORTS[name])
    assert run.returncode in (0, 1, 3), run.stderr
    assert run.stdout.strip() and run.stderr.strip()
    assert_clean(f"{name} stdout", run.stdout)
    assert_clean(f"{name} stderr", run.stderr)
    if not REPORTS[name] or REPORTS[name][0] != "-j":
        out = run.stdout.decode("utf-8", "surrogateescape")
        assert "rank 3" in out or "3" in out
        assert not any(line.lstrip("#- ").startswith("HEALTHY") for line in out.splitlines())  # no forged line


def test_every_file_output_escapes_the_hostile_job(job_dir, tmp_path):
    html, database, trace = tmp_path / "r.html", tmp_path / "db.sqlite", tmp_path / "t.json"
    run = frtrace(job_dir, "--workers", "1", "--html", html, "-o", database, "--timeline", trace)
    assert run.returncode == 1, run.stderr
    assert_clean("stderr", run.stderr)
    assert_clean("HTML", html.read_bytes())
    assert_clean("SQLite", _sqlite_text(database))
    assert_clean("timeline", trace.read_bytes())
    json.loads(trace.read_text())  # still a trace


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_diff_escapes_the_hostile_job(job_dir, tmp_path, fmt):
    newer = write_job(tmp_path / ("new" + EVIL.replace("\x00", "").replace("/", "")), hostile_dumps())
    run = frtrace("diff", job_dir, newer, "--format", fmt)
    assert run.returncode in (0, 1, 3), run.stderr
    assert run.stdout.strip()
    assert_clean(f"diff {fmt} stdout", run.stdout)
    assert_clean(f"diff {fmt} stderr", run.stderr)


def test_the_scanner_sees_what_it_must():
    for char in EVIL:
        if char not in "HEALTHY: al fine[2J]52;c;aGk=31mx\n":
            assert RAW.search(char), repr(char)
    assert not RAW.search(printable(EVIL))


def test_archive_member_names_are_escaped_wherever_they_are_said(job_dir, tmp_path):
    # Member names are kept whole until printed (issue 26 item 2): printed, they are escaped.
    import zipfile

    archive = tmp_path / "job.zip"
    inner = "d" + EVIL.replace("\x00", "").replace("/", "")
    with zipfile.ZipFile(archive, "w") as out:
        for path in sorted(job_dir.iterdir()):
            if path.is_file() and path.name.startswith("rank_"):
                out.writestr(f"{inner}/{path.name}", path.read_bytes())
        out.writestr(f"../{inner}/rank_7", b"x")  # refused, named
        out.writestr(f"{inner}/notes{EVIL[:8]}.txt", b"x")  # ignored, named with -v
    for args in ([], ["-v"], ["--format", "markdown"], ["-j", "--per-rank"]):
        run = frtrace(archive, "--workers", "1", *args)
        assert run.returncode in (0, 1, 3), run.stderr
        assert_clean(f"zip {args} stdout", run.stdout)
        assert_clean(f"zip {args} stderr", run.stderr)
        assert b"leaves the archive" in run.stderr
