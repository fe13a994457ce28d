"""Documentation that cannot lag (issue 25 item 9): every example output in README.md and
docs/ is the real output of its command, nothing is a placeholder, the docs build with
MkDocs in strict mode, and the README's test command is the one CI runs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from docs_examples import ROOT, Databases, documents, regenerated


def test_every_example_output_is_what_its_command_prints():
    stale = []
    with Databases() as databases:
        for path in documents():
            text = path.read_text(encoding="utf-8")
            if regenerated(text, databases) != text:
                stale.append(str(path.relative_to(ROOT)))
    assert not stale, f"examples out of date in {stale}: run python tests/docs_examples.py --update"


def test_the_docs_show_examples_and_no_placeholders():
    texts = {path.name: path.read_text(encoding="utf-8") for path in documents()}
    assert all("<!-- example: frtrace examples/hang_never_arrives -->" in texts[name] for name in ("README.md", "index.md"))
    assert texts["database.md"].count("<!-- example: sql ") >= 6
    for name, text in texts.items():
        assert not re.findall(r"\b[A-Z0-9]+_OUT\b", text), name


def test_the_readme_is_short_and_its_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 120
    commands = re.findall(r"^    (.*pytest.*)$", readme, re.M)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert commands == [ci[-1]]


def test_the_docs_build_with_mkdocs_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install '.[test]'")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "limits" / "index.html").exists()
