"""Write the Database and timeline files safely.

Takes an `OutputTarget` (see `output_paths.plan_output`, which checks the path before
anything is read), the `Analysis` and `Diagnosis`; writes the file atomically and
returns its path. The format follows the extension. A file that is one of the input
dumps is never replaced, whatever `force` says.
"""

from __future__ import annotations

import errno
import pickle
import sqlite3
from pathlib import Path
from typing import Iterable, Optional

from frtrace.diagnosis import Diagnosis
from frtrace.export.database import build_database
from frtrace.export.paths import (
    HTML,
    OutputError,
    OutputTarget,
    plan_output,
    refuse_input_files,
    write_atomically,
)
from frtrace.export.sqlite import write_sqlite
from frtrace.export.timeline import write_timeline
from frtrace.match.analysis import Analysis
from frtrace.model import TABLE_TYPES
from frtrace.report.html import write_html
from frtrace.util import cyclic_gc_paused

__all__ = ["OutputError", "OutputTarget", "plan_output", "table_types", "write_output"]
# SQLite says this instead of ENOSPC when the disk fills under it.
SQLITE_DISK_FULL = "database or disk is full"


def table_types() -> dict:
    """Field names of each Database table, stored next to the data in the pickle."""
    return {name: tuple(cls._fields) for name, cls in TABLE_TYPES.items()}  # type: ignore[attr-defined]  # NamedTuple classes


def _write_pickle(target: OutputTarget, analysis: Analysis) -> None:
    db = build_database(analysis.matches)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            pickle.dump((table_types(), db), handle, protocol=pickle.HIGHEST_PROTOCOL)

    write_atomically(target, write)


def write_output(target, kind: str, analysis: Analysis, diagnosis: Diagnosis, *, force: bool = False,
                 ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = (),
                 timeline_all: bool = False) -> Path:
    """Write a database (`kind="database"`), timeline (`kind="timeline"`) or HTML report (`kind="html"`) file to
    `target`: an OutputTarget, or a path to check here. A timeline draws the ranks
    `timeline.choose_ranks` picks (every rank with `timeline_all`)."""
    if not isinstance(target, OutputTarget):
        target = plan_output(Path(target), kind, force=force)
    # Pointing -o at a dump deserves that answer whatever its name.
    refuse_input_files(target, [d.path for d in analysis.load.dumps] + [e.path for e in analysis.load.errors])
    path = target.path
    # The exporters make millions of short-lived tuples and no reference cycles; each
    # collection would only rescan the analysis's millions of live objects (2x slower).
    try:
        with cyclic_gc_paused():
            _write(target, analysis, diagnosis, ranks, pg_filters, timeline_all)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OutputError(f"no space left on device writing {path}") from None
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except sqlite3.Error as exc:
        if SQLITE_DISK_FULL in str(exc):
            raise OutputError(f"no space left on device writing {path}") from None
        raise OutputError(f"{path}: cannot write the SQLite database ({exc})") from None
    return path


def _write(target: OutputTarget, analysis: Analysis, diagnosis: Diagnosis, ranks, pg_filters,
           timeline_all: bool) -> None:
    if target.kind == HTML:
        write_atomically(target, lambda tmp: write_html(tmp, analysis, diagnosis))
    elif target.kind == "timeline":
        write_atomically(target, lambda tmp: write_timeline(tmp, analysis, diagnosis, ranks, pg_filters,
                                                            compress=target.compressed, draw_all=timeline_all))
    elif target.is_sqlite:
        write_atomically(target, lambda tmp: write_sqlite(tmp, analysis, diagnosis))
    else:
        _write_pickle(target, analysis)
