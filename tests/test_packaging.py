"""frtrace can be published: `python -m build` makes an sdist and a wheel that `twine
check` passes, and the wheel holds every package, the API and the console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_build_and_twine_check(tmp_path):
    pytest.importorskip("build", reason="the test extra's build is not installed")
    pytest.importorskip("twine", reason="the test extra's twine is not installed")
    # Built from a copy: the build writes frtrace.egg-info beside the sources.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "*.egg-info", "build", "dist",
                                                                "__pycache__", ".pytest_cache", ".mypy_cache"))
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    artifacts = sorted((tmp_path / "dist").iterdir(), key=lambda p: p.suffix)
    assert [p.name[-7:] for p in artifacts] == [".tar.gz", "any.whl"]
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with zipfile.ZipFile(artifacts[1]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {"frtrace/api.py", "frtrace/errors.py", "frtrace/cli/main.py", "frtrace/load/loader.py"} <= names
    assert "frtrace = frtrace.cli:main" in entry_points
