"""The `frtrace` command: a thin click layer over the library.

Parses options, calls `pipeline.analyze`, `diagnosis.diagnose` and a renderer or
exporter, and maps the outcome to an exit code: 0 healthy, 1 faults, 2 usage or
input error, 3 inconclusive. Reports go to stdout; notes and errors to stderr.
"""

from __future__ import annotations

import errno
import functools
import gc
import math
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple, Optional

import click

from frtrace._version import __version__
from frtrace.diagnosis import diagnose
from frtrace.export.paths import DATABASE, HTML, TIMELINE, OutputError, plan_output
from frtrace.load.layout import MAX_WORLD_SIZE
from frtrace.load.loader import InputError, discover_dump_files, iter_dump_files, select_files
from frtrace.load.sources import as_input, is_url
from frtrace.match.analysis import analyze, match_files
from frtrace.model import LoadIssue
from frtrace.report.raw_view import (
    DEFAULT_LAST,
    SIDE_BY_SIDE_MAX,
    RenderedBlock,
    StackNumbers,
    rank_block_lines,
    render_block,
    side_by_side_lines,
)
from frtrace.report.render import RANK_VIEW_RENDERERS, render_json, render_markdown, render_text
from frtrace.util import fold_ranks, parse_rank_ranges, ranks_in
from frtrace.wording import printable

EXIT_HEALTHY, EXIT_FAULTS, EXIT_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
# What a shell reports for a process its signal ended: 128 + the signal number. CI must
# not read Ctrl-C (or a reader that stopped, as `| head` does) as "faults found" (1).
EXIT_SIGINT, EXIT_SIGPIPE, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGPIPE, 128 + signal.SIGTERM
EXIT_BY_STATUS = {"healthy": EXIT_HEALTHY, "faults": EXIT_FAULTS, "inconclusive": EXIT_INCONCLUSIVE}
DUMP_PATH_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# torchfrtrace takes several values after one flag (`--selected-ranks 0 1 2`).
MULTI_VALUE_OPTIONS = ("--selected-ranks", "--selected_ranks", "--pg-filters", "--pg_filters")

EPILOG = """\b
Examples:
  frtrace dumps/                      diagnose every rank's dump in dumps/
  frtrace -d dumps/ --format json     the same, as JSON for CI (exit 1 on faults)
  frtrace -d dumps/ -o db.pkl         also save the Database as a pickle
  frtrace -d dumps/ -o db.sqlite      ... or as SQLite, to query with SQL
  cd dumps && frtrace -j --selected-ranks 0 1
                                      raw entries of ranks 0 and 1, side by side
  frtrace -j --selected-ranks 3 --per-rank --last 50 dumps/
                                      what rank 3 was doing last: its 50 newest entries
  frtrace -j --pg-filters tp --print-stack-trace dumps/
                                      raw entries of the groups named or described "tp"
  frtrace diff dumps-1200/ dumps-1210/
                                      which ranks made no progress between two dumps of
                                      one job (frtrace diff --help; a dump directory
                                      named diff: frtrace ./diff)

\b
Exit codes: 0 healthy, 1 faults found, 2 usage or input error, 3 inconclusive,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM; 128+N for signal N).
"""


def _join_multi_values(args: list) -> list:
    """Rewrite `--selected-ranks 0 1 2` as `--selected-ranks=0,1,2` for click."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in MULTI_VALUE_OPTIONS:
            values, i = [], i + 1
            ranks = "rank" in arg
            while i < len(args) and not args[i].startswith("-") and (
                (ranks and args[i].replace(",", "").replace("-", "").isdigit()) or (not ranks and not _looks_like_path(args[i]))
            ):
                values.append(args[i])
                i += 1
            out.append(f"{arg}={','.join(values)}")
            continue
        out.append(arg)
        i += 1
    return out


def _looks_like_path(arg: str) -> bool:
    # `--pg-filters tp /typo/dir`: the directory, even one that does not exist, is the
    # positional argument, not a group name (which would leave the search in `.`).
    return os.sep in arg or os.path.exists(arg)


def _default_dump_dir() -> Path:
    for variable in DUMP_PATH_VARIABLES:
        value = os.environ.get(variable)
        if value:
            return Path(value).parent if Path(value).parent != Path("") else Path(".")
    return Path(".")


def _parse_size(text: str) -> int:
    """Bytes in `text` (`512M`, `4G`, `1.5k`, `100`); ValueError unless it is a positive size."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        number = float(text[:-1])
        if not math.isfinite(number):  # int() of 'infM' would raise OverflowError, not ValueError
            raise ValueError(f"not a finite size: {text!r}")
        size = int(number * units[text[-1]])
    else:
        size = int(text)
    # A limit of zero or less would refuse every file, which is never what was meant.
    if size <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return size


class _Progress:
    """A loading counter on stderr, only when stderr is a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (done < total and now - self.last < 0.2):
            return
        self.last = now
        # Matching thousands of ranks takes a while too: say so until the report starts.
        status = f"loading dumps: {done}/{total}" if done < total else f"loaded {total} dumps; matching ..."
        sys.stderr.write(f"\r{status}\033[K")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled and self.last:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("dump_dirs", nargs=-1, type=click.Path(path_type=str), metavar="[DIR_OR_FILE_OR_URL]...")
@click.option("-d", "--dir", "dirs", multiple=True, type=click.Path(path_type=str), help="Dump directory (searched recursively), file, archive (.tar, .tar.gz, .tgz, .zip) or URL (s3://, gs://, file://); repeatable.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the Database: .pkl pickle of (types, db); .sqlite/.sqlite3/.db SQLite.")
@click.option("--timeline", type=click.Path(path_type=Path), help="Write a Perfetto / chrome://tracing timeline (.json or .json.gz): by default the ranks around the findings, or as many ranks as fit 100,000 entries.")
@click.option("--timeline-all", is_flag=True, help="With --timeline, draw every rank, however large the file gets.")
@click.option("--html", type=click.Path(path_type=Path), help="Write a self-contained HTML report (.html): verdict, findings, a rank x group grid, where each rank is.")
@click.option("--ranks", "ranks_only", is_flag=True, help="Print only the verdict and where each rank is (one row per class of ranks that stand alike).")
@click.option("--force", is_flag=True, help="Replace an existing output file (never a dump file).")
@click.option("-p", "--prefix", help="Dump file name prefix before the rank number (default: inferred, e.g. rank_ or nccl_trace_rank_).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True, help="Report format on stdout.")
@click.option("-j", "--just-print-entries", "--just_print_entries", "just_print", is_flag=True, help="Print the raw entries side by side, one column per rank, rows aligned by group and sequence number.")
@click.option("--per-rank/--side-by-side", "per_rank", default=None, help=f"With -j: one block per rank, its entries in its own order, newest last (the default for more than {SIDE_BY_SIDE_MAX} ranks, or a table wider than the terminal); or the side-by-side table (at most {SIDE_BY_SIDE_MAX} ranks).")
@click.option("--last", "last", type=click.IntRange(min=0), default=None, help=f"With -j's per-rank blocks: the newest N entries of each rank (default {DEFAULT_LAST}; 0: all).")
@click.option("--selected-ranks", "--selected_ranks", "selected_ranks", help="Ranks to show with -j (e.g. '0 1' or 0-3,8) and to draw on the timeline.")
@click.option("--pg-filters", "--pg_filters", "pg_filters", help="Groups to show with -j / the timeline, by name or description (e.g. 'tp dp').")
@click.option("--print-stack-trace", "--print_stack_trace", "print_stack", is_flag=True, help="With -j, add the de-duplicated stack traces.")
@click.option("--mismatch-cap", "--mismatch_cap", type=click.IntRange(min=1), default=None, help="Print at most N findings per group (all are still analysed).")
@click.option("--allow-incomplete-ranks", "--allow_incomplete_ranks", is_flag=True, help="Accepted for torchfrtrace compatibility: missing ranks are always analysed as evidence.")
@click.option("--world-size", type=click.IntRange(min=1, max=MAX_WORLD_SIZE), help="Number of ranks in the job, when the highest ranks left no dump.")
@click.option("--transform-ft", "--transform_ft", is_flag=True, help="torchft dumps: group ranks in pg_config are local to each replica group.")
@click.option("--group-world-size", "--group_world_size", type=click.IntRange(min=1), help="With --transform-ft: ranks per replica group.")
@click.option("--all-generations", is_flag=True, help="Read every dump found together, even of several incidents (by default only the newest complete generation).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes that load dumps in parallel (default: number of cores).")
@click.option("--scheduler", metavar="ADDRESS", help="Read the dumps on a Dask cluster: a scheduler address (tcp://host:8786), or local[:N] for N local workers. Needs frtrace[dask].")
@click.option("--max-file-size", default="2G", show_default=True, help="Refuse dump files larger than this (bytes, or 512M, 4G).")
@click.option("--exit-zero", is_flag=True, help="Exit 0 after a report even when faults were found (errors still exit 2).")
@click.option("-v", "--verbose", is_flag=True, help="On stderr: ignored files, odd fields of every dump, and a timing line.")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an internal error.")
@click.version_option(__version__, "--version", prog_name="frtrace")
def frtrace(dump_dirs, dirs, output, timeline, timeline_all, html, ranks_only, force, prefix, fmt, just_print, per_rank, last, selected_ranks, pg_filters, print_stack,
            mismatch_cap, allow_incomplete_ranks, world_size, transform_ft, group_world_size, all_generations, workers, scheduler,
            max_file_size, exit_zero, verbose, debug):
    """Find the rank, process group and collective behind a hung PyTorch job
    from its Flight Recorder dumps (one file per rank).

    DIR_OR_FILE defaults to the directory of $TORCH_FR_DUMP_TEMP_FILE (or
    $TORCH_NCCL_DEBUG_INFO_TEMP_FILE) when set, else the current directory.

    Two dump sets of one job taken apart: frtrace diff OLD NEW (see
    frtrace diff --help) says which ranks made no progress between them.
    """
    started = time.monotonic()
    if sys.stdout is None:  # started with stdout closed (`frtrace DIR >&-`): say so before the work
        _fail("standard output is closed: nowhere to write the report")
    inputs = [as_input(item) for item in list(dirs) + list(dump_dirs)] or [_default_dump_dir()]
    for item in inputs:
        if not is_url(item) and not os.path.lexists(item):
            raise click.UsageError(f"{printable(str(item))}: no such directory or file")
    try:
        rank_ranges = parse_rank_ranges(selected_ranks, MAX_WORLD_SIZE) if selected_ranks is not None else None
    except ValueError as exc:
        raise click.UsageError(f"--selected-ranks {exc}")
    try:
        max_bytes = _parse_size(max_file_size)
    except ValueError:
        raise click.UsageError(f"--max-file-size takes a size such as 512M or 4G, not {max_file_size!r}")
    if transform_ft and not group_world_size:
        raise click.UsageError("--transform-ft needs --group-world-size")
    filters = _pg_filter_list(pg_filters)
    explicit_format = click.get_current_context().get_parameter_source("fmt") is not click.core.ParameterSource.DEFAULT
    _check_option_combinations(just_print, output, timeline, explicit_format, selected_ranks, pg_filters, print_stack)
    if not just_print and (per_rank is not None or last is not None):
        _note("note: --per-rank, --side-by-side and --last only apply to -j")
    if just_print and (html or ranks_only):
        raise click.UsageError(f"-j prints the raw entries only; it does not combine with {'--html' if html else '--ranks'} "
                               "(run frtrace twice)")
    if timeline_all and not timeline:
        _note("note: --timeline-all only changes what --timeline draws")
    # Every output is checked before any dump is read: a bad -o fails now, not after the load.
    try:
        targets = _plan_outputs(output, timeline, force, inputs, html)
    except OutputError as exc:
        _fail(str(exc))

    if just_print:
        # No diagnosis, and only the files of the selected ranks (chosen by name) are read.
        return _print_raw_entries(RawOptions(inputs, prefix, all_generations, rank_ranges, filters, print_stack, per_rank, last,
                                             world_size, workers or (os.cpu_count() or 1), max_bytes,
                                             group_world_size if transform_ft else None, verbose), started)

    progress = _Progress(sys.stderr.isatty())
    try:
        analysis = analyze(
            inputs, prefix=prefix, world_size=world_size, workers=workers or (os.cpu_count() or 1),
            max_bytes=max_bytes, progress=progress,
            ft_group_world_size=group_world_size if transform_ft else None, all_generations=all_generations,
            scheduler=scheduler,
        )
    except InputError as exc:
        progress.clear()
        _fail(str(exc))
    progress.clear()
    unusable = analysis.load.errors + list(analysis.layout.ignored_files)
    if not analysis.layout.ranks_found:
        # Every file was read but none has a believable rank: as with no readable file.
        where = ", ".join(str(p) for p in inputs)
        _fail(f"no usable dump in {where}: " + "; ".join(str(e) for e in unusable[:3]))
    for note in analysis.load.notes:
        _note(note)
    for issue in unusable:
        _note(f"skipped {issue}")
    _note_odd_fields(analysis.load.dumps, verbose)
    if verbose:
        for issue in analysis.load.skipped:
            _note(f"ignored {issue}")
    load_seconds = time.monotonic() - started
    job_ranks = analysis.layout.ranks_found + analysis.layout.ranks_missing
    ranks = _selected_job_ranks(rank_ranges, job_ranks)

    diagnosis = diagnose(analysis)
    failed = [str(exc) for exc in _write_outputs(targets, analysis, diagnosis, ranks, filters, timeline_all)]
    if ranks_only:
        _emit(RANK_VIEW_RENDERERS[fmt](analysis, diagnosis, style=_styler()))
    elif fmt == "json":
        _emit(render_json(analysis, diagnosis))
    elif fmt == "markdown":
        _emit(render_markdown(analysis, diagnosis, mismatch_cap) + "\n")
    else:
        _emit(render_text(analysis, diagnosis, mismatch_cap, _styler(), verbose))
    if failed:
        # The report is out; the run still failed to do all it was asked.
        for problem in failed:
            _note(f"error: {problem}")
        return _finish(EXIT_INPUT, verbose, started, load_seconds)
    code = EXIT_HEALTHY if exit_zero else EXIT_BY_STATUS[diagnosis.status]
    return _finish(code, verbose, started, load_seconds)


class RawOptions(NamedTuple):
    inputs: list
    prefix: Optional[str]
    all_generations: bool
    rank_ranges: Optional[tuple]
    filters: list
    print_stack: bool
    per_rank: Optional[bool]  # None: chosen by the number of ranks and the terminal's width
    last: Optional[int]
    world_size: Optional[int]
    workers: int
    max_bytes: int
    ft_group_world_size: Optional[int]
    verbose: bool


def _print_raw_entries(opts: RawOptions, started: float):
    """-j: the side-by-side table for a few ranks, else one block per rank, written as
    each rank's file is read. Reads only the files of the selected ranks; no diagnosis."""
    try:
        found = discover_dump_files([as_input(p) for p in opts.inputs], opts.prefix, opts.all_generations, opts.max_bytes)
    except InputError as exc:
        _fail(str(exc))
    for note in found.notes:
        _note(note)
    if opts.verbose:
        for issue in found.skipped:
            _note(f"ignored {issue}")
    if not found.files:
        _fail(f"no Flight Recorder dump files found in {', '.join(str(p) for p in opts.inputs)}")
    files = found.files
    spans = opts.rank_ranges
    if spans is not None:
        files = select_files(files, lambda rank: any(rank in span for span in spans))
    _note_ranks_without_files(found.files, opts.rank_ranges)
    if not files:
        present = [rank for rank, _ in found.files]
        _note(f"note: --selected-ranks: no dump file of those ranks (files for ranks {fold_ranks(present)})")
        _emit("No entries match the selected ranks and groups.\n")
        return _finish(EXIT_HEALTHY, opts.verbose, started, time.monotonic() - started)
    if opts.per_rank is False and len(files) > SIDE_BY_SIDE_MAX:
        _fail(f"--side-by-side shows at most {SIDE_BY_SIDE_MAX} ranks, not {len(files)} "
              "(choose them with --selected-ranks, or leave it out for one block per rank)")
    if opts.per_rank or len(files) > SIDE_BY_SIDE_MAX:
        for issue in found.refused:  # archive members refused by name or kind (the table's load says them)
            _note(f"skipped {issue}")
        return _print_rank_blocks(files, opts, started)
    progress = _Progress(sys.stderr.isatty())
    loaded, layout, matches = match_files(files, found, world_size=opts.world_size, workers=opts.workers,
                                          max_bytes=opts.max_bytes, progress=progress,
                                          ft_group_world_size=opts.ft_group_world_size)
    progress.clear()
    load_seconds = time.monotonic() - started
    for issue in loaded.errors + list(layout.ignored_files):
        _note(f"skipped {issue}")
    if not loaded.dumps:
        _fail("no usable dump among " + ", ".join(str(path) for _, path in files[:3]))
    ranks: Optional[list] = None
    if opts.rank_ranges is not None:
        ranks = ranks_in(opts.rank_ranges, layout.ranks_found + layout.ranks_missing)
    if opts.print_stack and not any(d.has_frames for d in loaded.dumps):
        _note("note: --print-stack-trace: these dumps hold no stack frames (taken with stacks off, or JSON)")
    lines = list(side_by_side_lines(matches, ranks, opts.filters, opts.print_stack))
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() and opts.per_rank is None else None
    if width and max(map(len, lines)) > width:
        _note(f"note: the side-by-side table is wider than this terminal ({width} columns): one block per rank "
              "(--side-by-side keeps the table)")
        stacks = StackNumbers() if opts.print_stack else None
        by_rank = {d.rank: d for d in loaded.dumps}
        by_rank.update({rank: issue for rank, issue in zip(loaded.failed_ranks, loaded.errors)})
        for rank, _ in files:
            _emit_block(rank_block_lines(rank, by_rank[rank], opts.filters, _last(opts.last), stacks))
        return _finish(EXIT_HEALTHY, opts.verbose, started, load_seconds)
    if opts.last is not None:
        _note("note: --last only applies to the per-rank blocks (--per-rank); the table shows every entry")
    _emit_lines(lines)
    return _finish(EXIT_HEALTHY, opts.verbose, started, load_seconds)


def _last(last: Optional[int]) -> int:
    return DEFAULT_LAST if last is None else last


def _print_rank_blocks(files: list, opts: RawOptions, started: float):
    """One block per rank, each written (and flushed) as soon as that rank's file is read.
    Without stacks the loader's workers render the blocks: only their text travels."""
    stacks = StackNumbers() if opts.print_stack else None
    render = None if stacks else functools.partial(render_block, pg_filters=tuple(opts.filters), last=_last(opts.last))
    failed, frames = 0, False
    for rank, result in iter_dump_files(files, workers=opts.workers, max_bytes=opts.max_bytes, transform=render):
        if render is None:
            result = RenderedBlock("".join(line + "\n" for line in rank_block_lines(
                rank, result, opts.filters, _last(opts.last), stacks)) + "\n", getattr(result, "has_frames", False),
                result if isinstance(result, LoadIssue) else None)
        if result.issue is not None:
            failed += 1
            _note(f"skipped {result.issue}")
        frames = frames or result.has_frames
        _emit(result.text)
    if opts.print_stack and not frames:
        _note("note: --print-stack-trace: these dumps hold no stack frames (taken with stacks off, or JSON)")
    if failed == len(files):
        _fail("no usable dump among " + ", ".join(str(path) for _, path in files[:3]))
    return _finish(EXIT_HEALTHY, opts.verbose, started, time.monotonic() - started)


def _note_ranks_without_files(files: list, rank_ranges: Optional[tuple]) -> None:
    """Ranks below the highest one found (and selected) that have no dump file."""
    present = {rank for rank, _ in files}
    top = max(present)
    spans = rank_ranges if rank_ranges is not None else (range(0, top + 1),)
    absent = sorted({rank for span in spans for rank in range(span.start, min(span.stop, top + 1)) if rank not in present})
    if absent:
        _note(f"note: no dump file for {'rank' if len(absent) == 1 else 'ranks'} {fold_ranks(absent)}")


def _emit_block(lines) -> None:
    _emit("".join(line + "\n" for line in lines) + "\n")


def _emit_lines(lines: list) -> None:
    """Write lines in slices: the reader sees the first ones before the last are joined."""
    for start in range(0, len(lines), 256):
        _emit("".join(line + "\n" for line in lines[start:start + 256]))


def _pg_filter_list(pg_filters: Optional[str]) -> list:
    filters = (pg_filters or "").replace(",", " ").split()
    for name in filters:
        if os.sep in name:
            raise click.UsageError(f"--pg-filters takes group names or descriptions; {name!r} looks like a path "
                                   "(put the dump directory first, or use -d DIR)")
    if pg_filters is not None and not filters:
        raise click.UsageError("--pg-filters needs at least one group name or description")
    return filters


def _check_option_combinations(just_print: bool, output, timeline, explicit_format: bool, selected_ranks, pg_filters,
                               print_stack: bool) -> None:
    """Refuse what would be silently dropped; note what only narrows another option."""
    if just_print:
        given = [flag for flag, value in (("-o", output), ("--timeline", timeline), ("--format", explicit_format)) if value]
        if given:
            raise click.UsageError(f"-j prints the raw entries only; it does not combine with {', '.join(given)} "
                                   "(run frtrace twice)")
        return
    narrowing = [flag for flag, value in (("--selected-ranks", selected_ranks), ("--pg-filters", pg_filters)) if value is not None]
    if narrowing and not timeline:
        verb = "narrows" if len(narrowing) == 1 else "narrow"
        _note(f"note: {' and '.join(narrowing)} only {verb} -j and --timeline; the diagnosis covers every rank and group")
    if print_stack:
        _note("note: --print-stack-trace only applies to -j; the report shows call sites when the dumps have stacks")


OUTPUT_FLAGS = {DATABASE: "-o", TIMELINE: "--timeline", HTML: "--html"}


def _plan_outputs(output: Optional[Path], timeline: Optional[Path], force: bool, inputs: list,
                  html: Optional[Path] = None) -> list:
    targets = [plan_output(path, kind, force=force, input_roots=inputs)
               for path, kind in ((output, DATABASE), (timeline, TIMELINE), (html, HTML)) if path is not None]
    for i, first in enumerate(targets):
        for second in targets[i + 1:]:
            if os.path.realpath(first.path) == os.path.realpath(second.path):
                raise OutputError(f"{first.path}: {OUTPUT_FLAGS[first.kind]} and {OUTPUT_FLAGS[second.kind]} name the same file")
    return targets


def _selected_job_ranks(rank_ranges: Optional[tuple], job_ranks: tuple) -> Optional[list]:
    if rank_ranges is None:
        return None
    ranks = ranks_in(rank_ranges, job_ranks)
    if not ranks:
        _note(f"note: --selected-ranks: none of those ranks is in this job (ranks {min(job_ranks)}-{max(job_ranks)})")
    return ranks


# What -o's extension made of the Database: torchfrtrace users expect a pickle whatever the name.
WRITTEN_AS = {"pickle": "pickle of (types, db)", "SQLite": "SQLite database; -o NAME.pkl writes a pickle"}


def _write_outputs(targets: list, analysis, diagnosis, ranks: Optional[list], filters: list,
                   timeline_all: bool = False) -> list:
    """Write each output; the OutputErrors of those that failed (the report still follows)."""
    # Imported when asked for (as the `diff` command's modules are): most runs write no
    # file, and every run pays for what it imports before the first dump is read.
    from frtrace.export.outputs import write_output
    from frtrace.export.timeline import choose_ranks

    failed = []
    for target in targets:
        what = WRITTEN_AS.get(target.format, target.format)
        if sys.stderr.isatty():  # a database of thousands of ranks takes a while
            _note(f"writing {target.path} ({what}) ...")
        try:
            write_output(target, target.kind, analysis, diagnosis, ranks=ranks, pg_filters=filters,
                         timeline_all=timeline_all)
        except OutputError as exc:
            failed.append(exc)
            continue
        _note(f"wrote {target.path} ({what})")
        if target.kind == TIMELINE:
            # The same choice write_timeline made: what the trace leaves out, and how to get it.
            note = choose_ranks(analysis, diagnosis, ranks, draw_all=timeline_all).note
            if note:
                _note(note)
    return failed


def _styler():
    # https://no-color.org: any non-empty NO_COLOR turns colour off.
    return click.style if sys.stdout.isatty() and not os.environ.get("NO_COLOR") else None


def _emit(text: str) -> None:
    """Write the report to stdout; a reader that stopped or a full disk ends the run clearly."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head -1`): end quietly with the code a shell gives a
        # tool that SIGPIPE ended, and let nothing try to flush into the pipe again.
        _silence_stdout()
        sys.exit(EXIT_SIGPIPE)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            _fail("no space left on device writing standard output")
        _fail(f"cannot write standard output ({exc.strerror or exc})")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


def _note(message: str) -> None:
    """One line on stderr. It may quote dump strings or paths: escaped, so a file name
    cannot drive the terminal or forge a line."""
    try:
        click.echo(f"frtrace: {printable(message)}", err=True)
    except (OSError, ValueError):  # stderr closed or its reader gone: nowhere left to say it
        pass


# Without -v, a job whose every dump has the same odd field gets a few lines, not thousands.
ODD_FIELD_NOTES = 3


def _note_odd_fields(dumps: list, verbose: bool) -> None:
    """One stderr line per dump with fields that were odd but not fatal (read, with defaults)."""
    odd = [dump for dump in dumps if dump.warnings]
    shown = odd if verbose else odd[:ODD_FIELD_NOTES]
    for dump in shown:
        _note(f"odd fields in {dump.path}: {'; '.join(dump.warnings)}")
    if len(odd) > len(shown):
        _note(f"... and {len(odd) - len(shown)} more dumps with odd fields (-v lists them all; "
              "also in inputs.warnings of --format json)")


def _fail(message: str):
    _note(f"error: {message}")
    sys.exit(EXIT_INPUT)


def _finish(code: int, verbose: bool, started: float, load_seconds: float):
    if verbose:
        total = time.monotonic() - started
        _note(f"{total:.2f}s total ({load_seconds:.2f}s loading and matching)")
    sys.exit(code)


DIFF_EPILOG = """\b
Examples:
  frtrace diff dumps-1200/ dumps-1210/
                                      a hang dumped twice, ten minutes apart
  frtrace diff old/ new/ --format json
                                      the same, as JSON for CI (schema frtrace.diff/1)

\b
Exit codes: 0 every rank moved on, 1 some rank made no progress (stuck), 2 usage or
input error (also: OLD and NEW are not dumps of one run), 3 cannot tell (e.g. a rank
dumped in only one of the two).
"""


@click.command(epilog=DIFF_EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("old", type=click.Path(path_type=Path), metavar="OLD")
@click.argument("new", type=click.Path(path_type=Path), metavar="NEW")
@click.option("-p", "--prefix", help="Dump file name prefix before the rank number (default: inferred).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True, help="Report format on stdout.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes that load dumps in parallel (default: number of cores).")
@click.option("--max-file-size", default="2G", show_default=True, help="Refuse dump files larger than this (bytes, or 512M, 4G).")
@click.option("--exit-zero", is_flag=True, help="Exit 0 after a report even when ranks made no progress (errors still exit 2).")
@click.option("-v", "--verbose", is_flag=True, help="On stderr: ignored files and a timing line.")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an internal error.")
def frtrace_diff(old, new, prefix, fmt, workers, max_file_size, exit_zero, verbose, debug):
    """Which ranks and process groups made no progress between two Flight Recorder
    dump sets of one job (OLD, then NEW, each a dump directory or file): stuck in
    the op they already waited in, or idle; and which moved on.
    """
    started = time.monotonic()
    if sys.stdout is None:
        _fail("standard output is closed: nowhere to write the report")
    for item in (old, new):
        if not os.path.lexists(item):
            raise click.UsageError(f"{item}: no such directory or file")
    if os.path.realpath(old) == os.path.realpath(new):
        raise click.UsageError(f"OLD and NEW are the same path ({old}): give two dumps of the job taken apart")
    try:
        max_bytes = _parse_size(max_file_size)
    except ValueError:
        raise click.UsageError(f"--max-file-size takes a size such as 512M or 4G, not {max_file_size!r}")
    from frtrace.report.diff_render import (  # see _write_outputs
        render_diff_json,
        render_diff_markdown,
        render_diff_text,
    )
    from frtrace.report.progress_diff import JobMismatch, diff_progress

    analyses = [_analyze_one(label, path, prefix, workers, max_bytes, verbose) for label, path in (("OLD", old), ("NEW", new))]
    try:
        diff = diff_progress(*analyses)
    except JobMismatch as exc:
        _fail(str(exc))
    if fmt == "json":
        _emit(render_diff_json(diff))
    elif fmt == "markdown":
        _emit(render_diff_markdown(diff, str(old), str(new)))
    else:
        _emit(render_diff_text(diff, str(old), str(new), _styler()))
    code = EXIT_HEALTHY if exit_zero else EXIT_BY_STATUS[diff.status]
    return _finish(code, verbose, started, time.monotonic() - started)


def _analyze_one(label: str, path: Path, prefix, workers, max_bytes: int, verbose: bool):
    """One dump set of `frtrace diff`, loaded and matched; notes say which set they are about."""
    progress = _Progress(sys.stderr.isatty())
    try:
        analysis = analyze([path], prefix=prefix, workers=workers or (os.cpu_count() or 1), max_bytes=max_bytes,
                           progress=progress)
    except InputError as exc:
        progress.clear()
        _fail(f"{label}: {exc}")
    progress.clear()
    if not analysis.layout.ranks_found:
        _fail(f"{label}: no usable dump in {path}")
    for note in analysis.load.notes:
        _note(f"{label}: {note}")
    for issue in analysis.load.errors + list(analysis.layout.ignored_files):
        _note(f"{label}: skipped {issue}")
    if verbose:
        for issue in analysis.load.skipped:
            _note(f"{label}: ignored {issue}")
    return analysis


def _command_for(argv: list) -> tuple:
    """`frtrace diff OLD NEW` runs the diff command; anything else is `frtrace [DIR]...`
    (a dump directory named diff is reached as `frtrace ./diff`)."""
    if argv and argv[0] == "diff":
        if len(argv) == 1 and os.path.isdir("diff"):
            _note("note: `frtrace diff` compares two dump sets; for the dump directory named diff, run frtrace ./diff")
        return frtrace_diff, argv[1:], "frtrace diff"
    return frtrace, _join_multi_values(argv), "frtrace"


def main(argv: Optional[list] = None) -> None:
    """Console entry point; internal errors become one line unless --debug is given.
    Ends the process (see _exit_now)."""
    command, args, prog_name = _command_for(list(sys.argv[1:] if argv is None else argv))
    # One short-lived run that builds millions of small objects with no reference cycles:
    # the cyclic collector would rescan them all, again and again, for nothing (a third of
    # the run time at 512 ranks). Reference counting still frees everything.
    gc.disable()
    _handle_stop_signals()
    try:
        command.main(args=args, prog_name=prog_name, standalone_mode=True)
    except (Interrupted, KeyboardInterrupt) as stop:
        # Temporary output files are gone by now: the signal unwound through their cleanup.
        code = stop.code if isinstance(stop, Interrupted) else EXIT_SIGINT
        _note("interrupted" if code == EXIT_SIGINT else "terminated")
        _exit_now(code)
    except SystemExit as done:
        # Exit from in here: leaving this block drops the exception's traceback, whose
        # frames hold the whole analysis, and freeing that takes seconds (12 s after a
        # 16,384-rank run) for a process that is ending anyway.
        _exit_now(done.code)
    except Exception as exc:  # a bug of ours: say so in one line, full detail on request
        if "--debug" in args:
            traceback.print_exc()
        else:
            _note(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
        _exit_now(EXIT_INPUT)
    _exit_now(EXIT_HEALTHY)


class Interrupted(BaseException):
    """SIGINT, SIGTERM or another stop signal (see stop_signals) arrived. A BaseException, so that click does not turn it into
    "Aborted!" and exit 1, and every `finally` on the way out (temporary files) runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.code = 128 + signum


def _on_stop_signal(main_pid: int, signum: int, frame) -> None:
    if os.getpid() != main_pid:
        # A forked loader worker (Ctrl-C reaches the whole process group): the main
        # process does the reporting; a worker just ends, without a traceback.
        os._exit(128 + signum)
    raise Interrupted(signum)


# Every signal whose default action ends the process and that another process (a shell,
# a scheduler, a terminal hanging up) sends: each unwinds like SIGTERM, so temporary
# output files are removed. SIGPIPE stays ignored (a closed reader is handled where the
# write fails); the faults a process raises on itself (SIGSEGV, SIGBUS, ...) cannot be
# handled in Python.
_STOP_SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGABRT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                      "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGPWR", "SIGIO", "SIGSTKFLT")


def stop_signals() -> tuple:
    """The signals `main` turns into a clean exit with 128 + their number, on this platform."""
    found = {getattr(signal, name) for name in _STOP_SIGNAL_NAMES if hasattr(signal, name)}
    if hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX"):
        found.update(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    return tuple(sorted(found))


def _handle_stop_signals() -> None:
    handler = functools.partial(_on_stop_signal, os.getpid())
    for signum in stop_signals():
        try:
            signal.signal(signum, handler)
        except (OSError, ValueError):  # reserved on this platform (a real-time signal libc keeps)
            continue


def _exit_now(code) -> None:
    # Tearing the interpreter down frees every object one by one: 15 s after a
    # 16,384-rank run, for a process that is ending anyway. Outputs are closed by now.
    if code is not None and not isinstance(code, int):
        click.echo(str(code), err=True)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None when the process started with it closed
                stream.flush()
        except (OSError, ValueError):  # a closed pipe (`frtrace ... | head`) or stream
            pass
    os._exit(code or 0)
