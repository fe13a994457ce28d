"""docs/api.md's example runs, and its outputs are what it prints.

The page's ```python cells run in order in one namespace, in a directory holding the job
the page describes; a cell's output is what it prints, then, as in a notebook, the repr
of its last line when that is an expression. Each must equal the ```text block after the
`<!-- output -->` mark that follows the cell. `FRTRACE_UPDATE_DOCS=1` writes them instead.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shutil
from pathlib import Path

from frtrace.testing.synth import Fault, generate, write_job

PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
CELL = re.compile(r"```python\n(?P<code>(?:(?!```).)*?)```\n\n<!-- output -->\n```text\n(?P<output>(?:(?!```).)*?)```", re.S)


def _run_cell(code: str, namespace: dict) -> str:
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, str(PAGE), "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), str(PAGE), "eval"), namespace)
            if value is not None:
                print(repr(value))
    return printed.getvalue()


def test_the_api_page_shows_what_its_example_prints(tmp_path, monkeypatch):
    hang = generate(world_size=8, tp=2, pp=2, steps=3, timing=True, fault=Fault("hang", rank=5, group="tp", step=2))
    write_job(hang, tmp_path / "dumps")
    shutil.copytree(tmp_path / "dumps", tmp_path / "dumps-later")  # nothing moved in between
    monkeypatch.chdir(tmp_path)
    page = PAGE.read_text()
    namespace: dict = {}
    cells = list(CELL.finditer(page))
    assert len(cells) >= 6
    produced = [_run_cell(cell["code"], namespace) for cell in cells]
    expected = [cell["output"] for cell in cells]
    if os.environ.get("FRTRACE_UPDATE_DOCS"):
        for cell, output in zip(reversed(cells), reversed(produced)):
            page = page[:cell.start("output")] + output + page[cell.end("output"):]
        PAGE.write_text(page)
        return
    assert produced == expected, "docs/api.md is out of date: rerun with FRTRACE_UPDATE_DOCS=1"
