"""`frtrace diff OLD NEW`: which ranks made no progress between two dump sets of one job.

Takes two inputs as the main command does (directories, files, archives, URLs); calls
`frtrace.api.diff` and writes the report in the format asked for. Exits 0 every rank
moved on, 1 some rank made no progress, 2 usage or input error, 3 cannot tell.
"""

from __future__ import annotations

import os
import sys
import time
from typing import NoReturn, Optional

import click

from frtrace.api import diff as compare
from frtrace.api import same_input
from frtrace.cli.options import CONTEXT_SETTINGS, input_options, report_options, run_options
from frtrace.cli.output import EXIT_BY_STATUS, EXIT_HEALTHY, _emit, _fail, _finish, _note, _styler, configure
from frtrace.cli.progress import Progress
from frtrace.cli.render import DIFF_REPORTS, RenderOptions
from frtrace.errors import InputError
from frtrace.load.sources import as_input, is_url
from frtrace.wording import printable

DIFF_EPILOG = """\b
Examples:
  frtrace diff dumps-1200/ dumps-1210/
                                      a hang dumped twice, ten minutes apart
  frtrace diff old/ new/ --format json
                                      the same, as JSON for CI (schema frtrace.diff/1)
  frtrace diff s3://bucket/job/1200/ s3://bucket/job/1210/
                                      the same from a bucket (the s3 extra)

\b
Exit codes: 0 every rank moved on, 1 some rank made no progress (stuck), 2 usage or
input error (also: OLD and NEW are not dumps of one run), 3 cannot tell (e.g. a rank
dumped in only one of the two).
"""


@click.command(epilog=DIFF_EPILOG, context_settings=CONTEXT_SETTINGS)
@click.argument("old", type=click.Path(path_type=str), metavar="OLD")
@click.argument("new", type=click.Path(path_type=str), metavar="NEW")
@input_options
@report_options(list(DIFF_REPORTS), "Exit 0 after a report even when ranks made no progress (errors still exit 2).")
@run_options("On stderr: ignored files and a timing line.")
def frtrace_diff(old: str, new: str, prefix: Optional[str], fmt: str, color: str, workers: Optional[int], max_file_size: int,
                 exit_zero: bool, quiet: bool, verbose: bool, debug: bool) -> NoReturn:
    """Which ranks and process groups made no progress between two Flight Recorder
    dump sets of one job (OLD, then NEW, each a dump directory, file, archive or
    URL): stuck in the op they already waited in, or idle; and which moved on.
    """
    started = time.monotonic()
    configure(quiet, color)
    if sys.stdout is None:
        _fail("standard output is closed: nowhere to write the report")
    inputs = [as_input(item) for item in (old, new)]
    for item in inputs:
        if not is_url(item) and not os.path.lexists(item):
            raise click.UsageError(f"{printable(str(item))}: no such directory or file")
    if same_input(*inputs):
        raise click.UsageError(f"OLD and NEW are the same path ({old}): give two dumps of the job taken apart")
    progress = Progress.of(sys.stderr.isatty() and not quiet, after_reading=None)
    try:
        result = compare(inputs[0], inputs[1], prefix=prefix, workers=workers, max_file_size=max_file_size,
                         progress=progress)
    except InputError as exc:  # JobMismatch too
        progress.clear()
        _fail(str(exc))
    progress.clear()
    for note in result.notes:
        _note(note)
    if verbose:
        for note in result.ignored:
            _note(note)
    _emit(DIFF_REPORTS[fmt](result, RenderOptions(color=_styler() is not None)))
    code = EXIT_HEALTHY if exit_zero else EXIT_BY_STATUS[result.status]
    _finish(code, verbose, started, time.monotonic() - started)
