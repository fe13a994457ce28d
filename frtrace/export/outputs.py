"""Write the Database and timeline files safely.

Takes an `OutputTarget` (see `output_paths.plan_output`, which checks the path before
anything is read), the `Analysis` and `Diagnosis`; `write_output` writes the file
atomically and returns its path. The format follows the extension. A file that is one
of the input dumps is never replaced, whatever `force` says. Where the analysis is not
in this process (a cluster's worker holds it), `make_output_file` makes the file
there and `write_made_output` puts its bytes in place here.
"""

from __future__ import annotations

import errno
import os
import pickle
import sqlite3
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

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
from frtrace.report.render import ReportParts
from frtrace.util import cyclic_gc_paused

__all__ = ["OutputError", "OutputTarget", "make_output_file", "output_writer", "plan_output", "table_types",
           "write_made_output", "write_output"]
# SQLite says this instead of ENOSPC when the disk fills under it.
SQLITE_DISK_FULL = "database or disk is full"


def table_types() -> dict[str, tuple[str, ...]]:
    """Field names of each Database table, stored next to the data in the pickle."""
    return {name: tuple(cls._fields) for name, cls in TABLE_TYPES.items()}  # type: ignore[attr-defined]  # NamedTuple classes


def _write_pickle(path: str, analysis: Analysis) -> None:
    db = build_database(analysis.matches)
    with open(path, "wb") as handle:
        pickle.dump((table_types(), db), handle, protocol=pickle.HIGHEST_PROTOCOL)


def write_output(target: Union[OutputTarget, str, os.PathLike[str]], kind: str, analysis: Analysis, diagnosis: Diagnosis,
                 *, force: bool = False, ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = (),
                 timeline_all: bool = False, parts: Optional[ReportParts] = None) -> Path:
    """Write a database (`kind="database"`), timeline (`kind="timeline"`) or HTML report (`kind="html"`) file to
    `target`: an OutputTarget, or a path to check here. A timeline draws the ranks
    `timeline.choose_ranks` picks (every rank with `timeline_all`). `parts`: what the
    HTML report shares with the others (report.render.ReportParts)."""
    if not isinstance(target, OutputTarget):
        target = plan_output(Path(target), kind, force=force)
    write = output_writer(target, analysis, diagnosis, ranks=ranks, pg_filters=pg_filters, timeline_all=timeline_all,
                          parts=parts)
    # The exporters make millions of short-lived tuples and no reference cycles; each
    # collection would only rescan the analysis's millions of live objects (2x slower).
    with _as_output_errors(target.path), cyclic_gc_paused():
        write_atomically(target, write)
    return target.path


def make_output_file(target: OutputTarget, analysis: Analysis, diagnosis: Diagnosis, *,
                     ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = (),
                     timeline_all: bool = False, parts: Optional[ReportParts] = None) -> str:
    """A new private temporary file of this machine holding what `write_output` would
    put at `target`; the caller removes it. On a cluster's worker, whose file system need
    not be the one `target` names, the output is made where the analysis is and only its
    bytes travel (`write_made_output` puts them in place). OutputError as write_output."""
    write = output_writer(target, analysis, diagnosis, ranks=ranks, pg_filters=pg_filters, timeline_all=timeline_all,
                          parts=parts)
    handle, tmp = tempfile.mkstemp(prefix=".frtrace-output.", suffix=".tmp")
    os.close(handle)
    try:
        with _as_output_errors(target.path, where="making"), cyclic_gc_paused():
            write(tmp)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_made_output(target: OutputTarget, pieces: Iterable[bytes]) -> Path:
    """Put the bytes of a made output (make_output_file) at `target`, given in pieces in
    order, atomically, as write_output would."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            for piece in pieces:
                handle.write(piece)

    with _as_output_errors(target.path):
        write_atomically(target, write)
    return target.path


def output_writer(target: OutputTarget, analysis: Analysis, diagnosis: Diagnosis, *,
                  ranks: Optional[Iterable[int]] = None, pg_filters: Iterable[str] = (),
                  timeline_all: bool = False, parts: Optional[ReportParts] = None) -> Callable[[str], object]:
    """What writes `target`'s output into a given (temporary) path. OutputError now when
    `target` is one of the dumps read: pointing -o at a dump deserves that answer
    whatever its name."""
    refuse_input_files(target, [d.path for d in analysis.load.dumps] + [e.path for e in analysis.load.errors])
    if target.kind == HTML:
        return lambda tmp: write_html(tmp, analysis, diagnosis, parts)
    if target.kind == "timeline":
        return lambda tmp: write_timeline(tmp, analysis, diagnosis, ranks, pg_filters, compress=target.compressed,
                                          draw_all=timeline_all)
    if target.is_sqlite:
        return lambda tmp: write_sqlite(tmp, analysis, diagnosis)
    return lambda tmp: _write_pickle(tmp, analysis)


@contextmanager
def _as_output_errors(path: Path, where: str = "writing") -> Iterator[None]:
    """OSError and SQLite errors raised inside, as one OutputError naming `path`."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OutputError(f"no space left on device {where} {path}") from None
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except sqlite3.Error as exc:
        if SQLITE_DISK_FULL in str(exc):
            raise OutputError(f"no space left on device {where} {path}") from None
        raise OutputError(f"{path}: cannot write the SQLite database ({exc})") from None
