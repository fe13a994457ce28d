"""Every example output in README.md and docs/*.md is the real output of its command.

An example is a fenced block right below a line `<!-- example: COMMAND -->`, where
COMMAND is `frtrace ARGS` (run from the repository root, 100 columns wide: the block holds
`$ frtrace ARGS` and then what it printed on stdout, or only that in a ```json block) or
`sql DIR` (the ```sql block just above it, run on the SQLite database of DIR and printed
as a table). tests/test_docs.py fails on any block that differs;
`python tests/docs_examples.py --update` writes them all anew.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = re.compile(r"<!-- example: (?P<command>.+?) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```\n", re.S)


def documents() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def frtrace_output(args: list[str]) -> str:
    """What `frtrace ARGS` prints on stdout, run from the repository root like a reader would."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    env.pop("NO_COLOR", None)
    done = subprocess.run([sys.executable, "-m", "frtrace", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode not in (0, 1, 3):
        raise RuntimeError(f"frtrace {shlex.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


class Databases:
    """The SQLite database of each dump directory the examples query, written once into a
    temporary directory that is removed on leaving the `with` block."""

    def __init__(self) -> None:
        self.paths: dict[str, Path] = {}

    def __enter__(self) -> "Databases":
        self.temporary = tempfile.TemporaryDirectory(prefix="frtrace-docs-")
        return self

    def __exit__(self, *exc) -> None:
        self.temporary.cleanup()

    def of(self, directory: str) -> Path:
        if directory not in self.paths:
            path = Path(self.temporary.name) / f"db{len(self.paths)}.sqlite"
            frtrace_output([directory, "-o", str(path)])
            self.paths[directory] = path
        return self.paths[directory]


def sql_output(directory: str, sql: str, databases: Databases) -> str:
    """The query's rows as a table (as the docs show them), on DIR's SQLite database."""
    with closing(sqlite3.connect(databases.of(directory))) as connection:
        cursor = connection.execute(sql)
        rows = cursor.fetchall()
        headers = [column[0] for column in cursor.description]
    return tabulate(rows, headers=headers) + "\n"


def _sql_above(text: str, end: int, command: str) -> str:
    start = text.rfind("```sql\n", 0, end)
    block = text[start + len("```sql\n"):end] if start >= 0 else ""
    if not block.endswith("```\n"):
        raise ValueError(f"an sql example needs a ```sql block right above it: {command}")
    return block[:-len("```\n")]


def regenerated(text: str, databases: Databases) -> str:
    """`text` with every example block holding its command's real output."""
    out, last = [], 0
    for match in EXAMPLE.finditer(text):
        command, lang = shlex.split(match["command"]), match["lang"]
        if command[0] == "frtrace":
            stdout = frtrace_output(command[1:])
            body = stdout if lang == "json" else f"$ {match['command']}\n{stdout}"
        elif command[0] == "sql" and len(command) == 2:
            body = sql_output(command[1], _sql_above(text, match.start(), match["command"]), databases)
        else:
            raise ValueError(f"unknown example command: {match['command']}")
        out += [text[last:match.start("body")], body]
        last = match.end("body")
    out.append(text[last:])
    return "".join(out)


def main() -> int:
    changed = []
    with Databases() as databases:
        for path in documents():
            text = path.read_text(encoding="utf-8")
            new = regenerated(text, databases)
            if new != text:
                changed.append(path)
                if "--update" in sys.argv:
                    path.write_text(new, encoding="utf-8")
    for path in changed:
        print(f"{'updated' if '--update' in sys.argv else 'out of date'}: {path.relative_to(ROOT)}")
    return 1 if changed and "--update" not in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
