"""The same dumps give the same answer, byte for byte, however they are laid out.

Each scenario's files are copied several times (fixed seeds) into shuffled layouts: the same
relative names written in a different order, random nested directories, explicit file
arguments in shuffled order, one or several loader processes. The JSON and text reports
must be byte-identical (paths, which legitimately differ between layouts, are compared by
file name), and so must the `-o db.pkl` Database, table by table and byte by byte.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, run_cli

from frtrace.testing.synth import Fault, generate
from frtrace.testing.synth import write_job as synth_write_job

SEEDS = (1, 2, 3)


def _fixture_files(name: str) -> dict:
    directory = FIXTURES / name
    if not directory.is_dir() or not any(directory.iterdir()):
        pytest.skip(f"fixture {name} is not present")
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _synth_files(tmp_path: Path, **kwargs) -> dict:
    directory = tmp_path / "synth_src"
    synth_write_job(generate(**kwargs), directory)
    files = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    shutil.rmtree(directory)
    return files


def _extras(files: dict) -> dict:
    """Unrelated files and an unreadable dump, so skipped/unreadable lists are compared too."""
    prefix = re.sub(r"\d+$", "", sorted(files)[0])
    highest = max(int(re.search(r"(\d+)$", n).group(1)) for n in files)
    return {**files, "train.log": b"step 1\n", "notes.txt": b"hello", f"{prefix}{highest + 1}": b"\x80\x02trunc"}


SCENARIOS = {
    "hang_never_arrives": lambda tmp: _extras(_fixture_files("hang_never_arrives")),
    "cascade_tp_dp": lambda tmp: _fixture_files("cascade_tp_dp"),
    "victim_missing_dump_json": lambda tmp: _extras(_fixture_files("victim_missing_dump_json")),
    "ring_wrap_uneven": lambda tmp: _fixture_files("ring_wrap_uneven"),
    "synth_hang_16": lambda tmp: _extras(_synth_files(tmp, world_size=16, tp=2, pp=2, steps=3, timing=True, lookahead=2,
                                                      fault=Fault("hang", rank=5, group="tp", step=2), seed=4)),
    "synth_wrapped_straggler": lambda tmp: _synth_files(tmp, world_size=8, tp=2, pp=2, steps=6, timing=True,
                                                        buffer_size=25, seed=9,
                                                        fault=Fault("straggler", rank=3, straggler_ms=40.0)),
}


def _write_flat(root: Path, files: dict, rng: random.Random) -> Path:
    """The same relative names, created in a shuffled order (directory order differs)."""
    directory = root / "dumps"
    directory.mkdir(parents=True)
    names = list(files)
    rng.shuffle(names)
    for name in names:
        (directory / name).write_bytes(files[name])
    return directory


def _write_nested(root: Path, files: dict, rng: random.Random) -> Path:
    """Every file in a random nested sub-directory (some share one), in a shuffled order."""
    directory = root / "dumps"
    pool = ["a", "b", "node01", "node02", "x.y", "z"]
    names = list(files)
    rng.shuffle(names)
    for name in names:
        sub = directory.joinpath(*rng.sample(pool, rng.randrange(0, 4)))
        sub.mkdir(parents=True, exist_ok=True)
        (sub / name).write_bytes(files[name])
    return directory


def _by_file_name(text: str, root: Path) -> str:
    """Replace every path under `root` with its file name."""
    return re.sub(re.escape(str(root)) + r"/[^\s:;,\"']*?([^/\s:;,\"']+)(?=[\s:;,\"']|$)", r"\1", text)


def _canonical_json(stdout: str, root: Path) -> dict:
    report = json.loads(stdout)
    for key, field in (("unreadable_files", "path"), ("skipped_files", "path"), ("dump_files", "path")):
        items = report["inputs"].get(key, [])
        for item in items:
            item[field] = Path(item[field]).name
        items.sort(key=lambda item: json.dumps(item, sort_keys=True))
    return report


def _run(directory_or_files, *extra, workers: int = 1):
    args = list(directory_or_files) if isinstance(directory_or_files, list) else [directory_or_files]
    # Paths differ in length between layouts: text laid out unwrapped differs only in them.
    result = run_cli(args + ["--workers", str(workers)] + list(extra), env={"COLUMNS": "100000"})
    assert result.exit_code in (0, 1, 3), result.output
    return result


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_reports_are_byte_identical_across_file_orders(scenario, tmp_path, monkeypatch):
    files = SCENARIOS[scenario](tmp_path)
    outputs = []
    for seed in SEEDS:
        root = tmp_path / f"flat{seed}"
        _write_flat(root, files, random.Random(seed))
        monkeypatch.chdir(root)  # the same relative paths in every copy
        outputs.append((_run("dumps", "--format", "json").stdout, _run("dumps").stdout,
                        _run("dumps", "--format", "markdown").stdout))
    assert all(out == outputs[0] for out in outputs[1:])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_reports_are_identical_across_nested_layouts(scenario, tmp_path):
    files = SCENARIOS[scenario](tmp_path)
    reference_root = tmp_path / "ref"
    reference = _write_flat(reference_root, files, random.Random(0))
    want_json = _canonical_json(_run(reference, "--format", "json").stdout, reference_root)
    want_text = _by_file_name(_run(reference).stdout, reference_root)
    for seed in SEEDS:
        root = tmp_path / f"nested{seed}"
        directory = _write_nested(root, files, random.Random(seed))
        got_json = _canonical_json(_run(directory, "--format", "json").stdout, root)
        assert got_json == want_json
        got_text = _by_file_name(_run(directory).stdout, root)
        assert got_text == want_text


@pytest.mark.parametrize("scenario", ["hang_never_arrives", "synth_hang_16"])
def test_explicit_files_in_any_order_and_worker_processes_give_the_same_bytes(scenario, tmp_path, monkeypatch):
    files = {n: b for n, b in SCENARIOS[scenario](tmp_path).items() if "rank" in n and not b.startswith(b"\x80\x02trunc")}
    _write_flat(tmp_path, files, random.Random(0))
    monkeypatch.chdir(tmp_path)
    want = _run("dumps", "--format", "json").stdout
    names = sorted(files)
    for seed in SEEDS:
        random.Random(seed).shuffle(names)
        assert _run([f"dumps/{n}" for n in names], "--format", "json").stdout == want
    assert _run("dumps", "--format", "json", workers=2).stdout == want
    assert _run("dumps", "--format", "json", workers=3).stdout == want


def _tables(path: Path) -> tuple:
    types, db = pickle.loads(path.read_bytes())
    return types, {name: list(getattr(db, name)) for name in types}


@pytest.mark.parametrize("scenario", ["cascade_tp_dp", "synth_hang_16", "synth_wrapped_straggler"])
def test_the_database_is_identical_across_layouts(scenario, tmp_path):
    files = SCENARIOS[scenario](tmp_path)
    blobs = []
    for seed in SEEDS:
        root = tmp_path / f"db{seed}"
        directory = (_write_nested if seed % 2 else _write_flat)(root, files, random.Random(seed))
        out = root / "db.pkl"
        _run(directory, "-o", out, workers=1 + seed % 2)
        blobs.append(out)
    want_types, want_tables = _tables(blobs[0])
    assert sum(len(rows) for rows in want_tables.values()) > 0
    for blob in blobs[1:]:
        types, tables = _tables(blob)
        assert types == want_types
        for name in want_tables:
            assert tables[name] == want_tables[name], f"table {name} differs"
        assert blob.read_bytes() == blobs[0].read_bytes()


def test_the_same_run_twice_gives_the_same_bytes(tmp_path):
    files = SCENARIOS["synth_wrapped_straggler"](tmp_path)
    directory = _write_flat(tmp_path / "one", files, random.Random(0))
    first = [_run(directory, "--format", fmt).stdout for fmt in ("json", "text", "markdown")]
    second = [_run(directory, "--format", fmt).stdout for fmt in ("json", "text", "markdown")]
    assert first == second
