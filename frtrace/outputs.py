"""Write the Database and timeline files safely.

Takes an output path, the `Analysis` and `Diagnosis`; writes the file atomically (a
temporary file in the same directory renamed into place) and returns its path. The
format follows the extension. An existing file is replaced only with `force`, and a
file that is one of the input dumps never is.
"""

from __future__ import annotations

import gc
import os
import pickle
import sqlite3
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional

from .database import build_database
from .diagnosis import Diagnosis
from .model import TABLE_TYPES
from .pipeline import Analysis
from .sqlite_export import write_sqlite
from .timeline import write_timeline

PICKLE_SUFFIXES = (".pkl", ".pickle")
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
TIMELINE_SUFFIXES = (".json", ".json.gz")
GZIP_TIMELINE_SUFFIX = ".json.gz"


class OutputError(Exception):
    """An output cannot be written; the message names the path and the reason."""


def table_types() -> dict:
    """Field names of each Database table, stored next to the data in the pickle."""
    return {name: tuple(cls._fields) for name, cls in TABLE_TYPES.items()}


def _check_target(path: Path, analysis: Analysis, force: bool) -> None:
    inputs = {os.path.realpath(d.path) for d in analysis.load.dumps}
    inputs |= {os.path.realpath(e.path) for e in analysis.load.errors}
    if os.path.realpath(path) in inputs:
        raise OutputError(f"{path}: refusing to overwrite an input dump file")
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; give a file name")
    if path.exists() and not force:
        raise OutputError(f"{path}: already exists (add --force to replace it)")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{path}: directory {parent} is not writable")


def write_atomically(path: Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` and rename the result over `path` only if it succeeded."""
    parent = path.parent if str(path.parent) else Path(".")
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    os.close(handle)
    try:
        write(tmp)
        # mkstemp creates 0600; give the output the mode any new file would get.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_pickle(path: Path, analysis: Analysis, diagnosis: Diagnosis) -> None:
    db = build_database(analysis.matches)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            pickle.dump((table_types(), db), handle, protocol=pickle.HIGHEST_PROTOCOL)

    write_atomically(path, write)


def write_output(path: Path, kind: str, analysis: Analysis, diagnosis: Diagnosis, *, force: bool = False,
                 ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = ()) -> Path:
    """Write a database (`kind="database"`) or timeline (`kind="timeline"`) file."""
    path = Path(path)
    # The target first: pointing -o at a dump deserves that answer whatever its name.
    _check_target(path, analysis, force)
    name = path.name.lower()
    if kind == "timeline":
        accepted = TIMELINE_SUFFIXES
    elif kind == "database":
        accepted = PICKLE_SUFFIXES + SQLITE_SUFFIXES
    else:
        raise OutputError(f"{path}: unknown output kind {kind!r}")
    if not name.endswith(accepted):
        raise OutputError(f"{path}: unsupported {kind} file type (use {', '.join(accepted)})")
    # The exporters make millions of short-lived tuples and no reference cycles; each
    # collection would only rescan the analysis's millions of live objects (2x slower).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if kind == "timeline":
            compress = name.endswith(GZIP_TIMELINE_SUFFIX)
            write_atomically(path, lambda tmp: write_timeline(tmp, analysis, diagnosis, ranks, pg_filters, compress=compress))
        elif name.endswith(PICKLE_SUFFIXES):
            _write_pickle(path, analysis, diagnosis)
        else:
            write_atomically(path, lambda tmp: write_sqlite(tmp, analysis, diagnosis))
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except sqlite3.Error as exc:
        raise OutputError(f"{path}: cannot write the SQLite database ({exc})") from None
    finally:
        if collecting:
            gc.enable()
    return path
