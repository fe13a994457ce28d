"""`frtrace [DIR]...`: the analysis, the command that runs when no other is named.

Parses the options, calls `frtrace.api.analyze` and `diagnose`, writes the outputs asked
for (export/) and the report in the format asked for (a renderer registered by name),
and exits 0 healthy, 1 faults, 2 usage or input error, 3 inconclusive. Reports go to
stdout; notes and errors to stderr. `-j` is cli/raw.py's.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, Sequence, Union

import click

from frtrace._version import __version__
from frtrace.api import Diagnosis, analyze, diagnose, on_cluster
from frtrace.cli.options import (
    CONTEXT_SETTINGS,
    GroupNamesType,
    RankRangesType,
    ValuesOption,
    group_value,
    input_options,
    rank_value,
    report_options,
    run_options,
)
from frtrace.cli.output import (
    EXIT_BY_STATUS,
    EXIT_HEALTHY,
    EXIT_INPUT,
    _emit,
    _fail,
    _finish,
    _note,
    _say,
    _styler,
    _text_width,
    configure,
)
from frtrace.cli.progress import Progress
from frtrace.cli.raw import RawOptions, _print_raw_entries
from frtrace.cli.remote import (
    LogsRequest,
    MadeOutput,
    OutputRequest,
    RemoteReport,
    ReportRequest,
    analysis_notes,
    report_on_worker,
)
from frtrace.cli.render import RANK_VIEWS, REPORTS, RenderOptions
from frtrace.errors import InputError
from frtrace.cli.logs_cli import (
    LogRun,
    add_logs,
    logs_in_dump_inputs,
    refuse_dump_only_options,
    render_with_logs,
    run_logs_only,
    split_log_inputs,
)
from frtrace.export.paths import DATABASE, HTML, TIMELINE, OutputError, OutputTarget, plan_output
from frtrace.load.layout import MAX_WORLD_SIZE
from frtrace.load.sources import as_input, is_url
from frtrace.report.raw_view import DEFAULT_LAST, SIDE_BY_SIDE_MAX
from frtrace.util import ranks_in
from frtrace.wording import printable

if TYPE_CHECKING:
    from frtrace.api import Analysis
    from frtrace.diagnosis import Diagnosis as Findings
    from frtrace.load.cluster import WorkerFiles
    from frtrace.report.render import ReportParts

DUMP_PATH_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")

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
  frtrace job.log                     no dumps: the rank (and host) behind the hang
                                      from the job's logs (a file, .gz, or a directory
                                      of per-rank or per-node logs)
  frtrace dumps/ --logs job.log       dumps and logs: the logs stand in for missing dumps

\b
Every option's default can also come from FRTRACE_<OPTION> (FRTRACE_WORKERS=8,
FRTRACE_FORMAT=json). Shell completion: eval "$(_FRTRACE_COMPLETE=bash_source frtrace)"
(zsh_source, fish_source for those shells).

\b
Exit codes: 0 healthy, 1 faults found, 2 usage or input error, 3 inconclusive,
130 interrupted (Ctrl-C), 141 the reader of stdout went away (| head),
143 terminated (SIGTERM; 128+N for any other signal N that ends it).
"""


class AnalysisCommand(click.Command):
    """The default command: its help also lists the commands beside it (`diff`), and
    run as the group's default its usage reads `frtrace [OPTIONS] ...`."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        parent = ctx.parent
        if parent is not None and isinstance(parent.command, click.Group):
            parent.command.format_commands(parent, formatter)


def _default_dump_dir() -> Path:
    for variable in DUMP_PATH_VARIABLES:
        value = os.environ.get(variable)
        if value:
            return Path(value).parent if Path(value).parent != Path("") else Path(".")
    return Path(".")


@click.command(cls=AnalysisCommand, epilog=EPILOG, context_settings=CONTEXT_SETTINGS)
@click.argument("dump_dirs", nargs=-1, type=click.Path(path_type=str), metavar="[DIR_OR_FILE_OR_URL]...")
@click.option("-d", "--dir", "dirs", multiple=True, envvar="FRTRACE_DIR", type=click.Path(path_type=str), help="Dump directory (searched recursively), file, archive (.tar, .tar.gz, .tgz, .zip) or URL (s3://, gs://, file://); repeatable.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the Database: .pkl pickle of (types, db); .sqlite/.sqlite3/.db SQLite.")
@click.option("--timeline", type=click.Path(path_type=Path), help="Write a Perfetto / chrome://tracing timeline (.json or .json.gz): by default the ranks around the findings, or as many ranks as fit 100,000 entries.")
@click.option("--timeline-all", is_flag=True, help="With --timeline, draw every rank, however large the file gets.")
@click.option("--html", type=click.Path(path_type=Path), help="Write a self-contained HTML report (.html): verdict, findings, a rank x group grid, where each rank is.")
@click.option("--ranks", "ranks_only", is_flag=True, envvar="FRTRACE_RANKS", help="Print only the verdict and where each rank is (one row per class of ranks that stand alike).")
@click.option("--all", "show_all", is_flag=True, help="Text report: every finding and every row of where each rank is (by default consequences fold into one line per class of groups, and 12 rows show).")
@click.option("--force", is_flag=True, help="Replace an existing output file (never a dump file).")
@input_options
@report_options(list(REPORTS), "Exit 0 after a report even when faults were found (errors still exit 2).")
@click.option("-j", "--just-print-entries", "--just_print_entries", "just_print", is_flag=True, envvar="FRTRACE_JUST_PRINT_ENTRIES", help="Print the raw entries side by side, one column per rank, rows aligned by group and sequence number.")
@click.option("--per-rank/--side-by-side", "per_rank", default=None, help=f"With -j: one block per rank, its entries in its own order, newest last (the default for more than {SIDE_BY_SIDE_MAX} ranks, or a table wider than the terminal); or the side-by-side table (at most {SIDE_BY_SIDE_MAX} ranks).")
@click.option("--last", "last", type=click.IntRange(min=0), default=None, help=f"With -j's per-rank blocks: the newest N entries of each rank (default {DEFAULT_LAST}; 0: all).")
@click.option("--selected-ranks", "--selected_ranks", "selected_ranks", cls=ValuesOption, accepts=rank_value, type=RankRangesType(), metavar="RANKS...", help="Ranks to show with -j (e.g. 0 1, or 0-3,8) and to draw on the timeline.")
@click.option("--pg-filters", "--pg_filters", "pg_filters", cls=ValuesOption, accepts=group_value, type=GroupNamesType(), metavar="GROUPS...", help="Groups to show with -j / the timeline, by name or description (e.g. tp dp).")
@click.option("--print-stack-trace", "--print_stack_trace", "print_stack", is_flag=True, envvar="FRTRACE_PRINT_STACK_TRACE", help="With -j, add the de-duplicated stack traces.")
@click.option("--mismatch-cap", "--mismatch_cap", type=click.IntRange(min=1), default=None, help="Print at most N findings per group (all are still analysed).")
@click.option("--allow-incomplete-ranks", "--allow_incomplete_ranks", is_flag=True, help="Accepted for torchfrtrace compatibility: missing ranks are always analysed as evidence.")
@click.option("--world-size", type=click.IntRange(min=1, max=MAX_WORLD_SIZE), help="Number of ranks in the job, when the highest ranks left no dump.")
@click.option("--transform-ft", "--transform_ft", is_flag=True, help="torchft dumps: group ranks in pg_config are local to each replica group.")
@click.option("--group-world-size", "--group_world_size", type=click.IntRange(min=1), help="With --transform-ft: ranks per replica group.")
@click.option("--all-generations", is_flag=True, help="Read every dump found together, even of several incidents (by default only the newest complete generation).")
@click.option("--scheduler", metavar="ADDRESS", help="Read and analyse the dumps on a Dask cluster: a scheduler address (tcp://host:8786), or local[:N] for N local workers; only the report and the files asked for come back. Needs the dask extra (pip install '.[dask]' in a checkout of frtrace).")
@click.option("--logs", "logs", multiple=True, type=click.Path(exists=True, path_type=str), help="The job's logs as evidence too (a file, gzip'd or not, or a directory of per-rank or per-node logs); repeatable. A log file or log directory given as DIR_OR_FILE is read the same way.")
@run_options("On stderr: ignored files, odd fields of every dump, and a timing line.")
@click.version_option(__version__, "--version", prog_name="frtrace")
def frtrace(dump_dirs: tuple[str, ...], dirs: tuple[str, ...], output: Optional[Path], timeline: Optional[Path],
            timeline_all: bool, html: Optional[Path], ranks_only: bool, show_all: bool, force: bool, prefix: Optional[str],
            fmt: str, color: str, just_print: bool, per_rank: Optional[bool], last: Optional[int],
            selected_ranks: Optional[tuple[range, ...]], pg_filters: Optional[tuple[str, ...]], print_stack: bool,
            mismatch_cap: Optional[int], allow_incomplete_ranks: bool, world_size: Optional[int], transform_ft: bool,
            group_world_size: Optional[int], all_generations: bool, workers: Optional[int], scheduler: Optional[str],
            max_file_size: int, exit_zero: bool, logs: tuple[str, ...], quiet: bool, verbose: bool, debug: bool) -> NoReturn:
    """Find the rank, process group and collective behind a hung PyTorch job
    from its Flight Recorder dumps (one file per rank).

    DIR_OR_FILE defaults to the directory of $TORCH_FR_DUMP_TEMP_FILE (or
    $TORCH_NCCL_DEBUG_INFO_TEMP_FILE) when set, else the current directory.

    Two dump sets of one job taken apart: frtrace diff OLD NEW (see
    frtrace diff --help) says which ranks made no progress between them.
    """
    started = time.monotonic()
    configure(quiet, color)
    if sys.stdout is None:  # started with stdout closed (`frtrace DIR >&-`): say so before the work
        _fail("standard output is closed: nowhere to write the report")
    inputs, log_paths = split_log_inputs([as_input(item) for item in list(dirs) + list(dump_dirs)], logs)
    inputs = inputs or ([] if log_paths else [_default_dump_dir()])
    for item in inputs:
        if not is_url(item) and not os.path.lexists(item):
            raise click.UsageError(f"{printable(str(item))}: no such directory or file")
    rank_ranges = selected_ranks
    if transform_ft and not group_world_size:
        raise click.UsageError("--transform-ft needs --group-world-size")
    filters = list(pg_filters or ())
    # Given on this command line (not FRTRACE_FORMAT, which -j may ignore).
    explicit_format = click.get_current_context().get_parameter_source("fmt") is click.core.ParameterSource.COMMANDLINE
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
    log_run = LogRun(fmt, ranks_only, mismatch_cap, world_size, html, force, exit_zero, verbose)
    if not inputs:  # logs only: frtrace job.log, frtrace --logs DIR
        refuse_dump_only_options(output, timeline, just_print)
        _finish(run_logs_only(log_paths, log_run, _emit, _fail, _note, _styler(), started), False, started, 0.0)

    progress = Progress.of(sys.stderr.isatty() and not quiet)
    if just_print:
        # No diagnosis, and only the files of the selected ranks (chosen by name) are read.
        if scheduler is not None:
            _note("note: -j reads the selected ranks' files in local worker processes (--workers); "
                  "--scheduler only applies to the analysis")
        _print_raw_entries(RawOptions(inputs, prefix, all_generations, rank_ranges, filters, print_stack, per_rank, last,
                                             world_size, workers or (os.cpu_count() or 1), max_file_size,
                                             group_world_size if transform_ft else None, verbose), started, progress)

    options = RenderOptions(mismatch_cap=mismatch_cap, verbose=verbose, color=_styler() is not None,
                            width=_text_width(), show_all=show_all)
    try:
        if scheduler is not None:
            # The report and the files are made on the cluster, where the entries stay; the
            # logs are read there too (by absolute path: the workers run elsewhere).
            outputs = OutputRequest(tuple(targets), rank_ranges, tuple(filters), timeline_all)
            logs_request = (LogsRequest(tuple(map(os.path.abspath, log_paths)), tuple(map(str, log_paths)), world_size)
                            if log_paths else None)
            _report_on_cluster(
                inputs, scheduler, ReportRequest(fmt, ranks_only, options, verbose, outputs, logs_request), rank_ranges, progress,
                started, exit_zero, dict(prefix=prefix, world_size=world_size, max_file_size=max_file_size,
                                group_world_size=group_world_size if transform_ft else None,
                                all_generations=all_generations))
        analysis = analyze(
            inputs, prefix=prefix, world_size=world_size, workers=workers, max_file_size=max_file_size,
            progress=progress, group_world_size=group_world_size if transform_ft else None,
            all_generations=all_generations, scheduler=scheduler,
        )
    except InputError as exc:
        progress.clear()
        log_dirs = logs_in_dump_inputs(inputs)  # no dump there: directories of logs?
        if log_dirs and len(log_dirs) == len(inputs):
            refuse_dump_only_options(output, timeline, False)
            _finish(run_logs_only(log_paths + log_dirs, log_run, _emit, _fail, _note, _styler(), started,
                                         no_job_error=str(exc)), False, started, 0.0)
        _fail(str(exc))
    progress.clear()
    for note in analysis_notes(analysis, verbose):
        _note(note)
    load_seconds = time.monotonic() - started
    job_ranks = analysis.layout.ranks_found + analysis.layout.ranks_missing
    ranks = _selected_job_ranks(rank_ranges, job_ranks)

    progress.phase("diagnosing")
    diagnosis = diagnose(analysis, processes=workers or (os.cpu_count() or 1))
    progress.clear()
    evidence = None
    if log_paths:  # dumps and logs: the logs stand in for missing dumps, and say where they disagree
        with_logs, evidence = add_logs(analysis, diagnosis.outcome, log_paths, world_size, _fail, _note)
        diagnosis = Diagnosis(analysis, with_logs, diagnosis.parts)
    failed = [str(exc) for exc in _write_outputs(targets, analysis, diagnosis.outcome, ranks, filters, timeline_all, progress,
                                                 diagnosis.parts)]
    if evidence is not None and not ranks_only and fmt != "ranks":
        _emit(render_with_logs(fmt, analysis, diagnosis.outcome, evidence, mismatch_cap, _styler(), verbose,
                              _text_width(), show_all, diagnosis.parts))
    else:
        _emit((RANK_VIEWS if ranks_only else REPORTS)[fmt](diagnosis, options))
    if failed:
        # The report is out; the run still failed to do all it was asked.
        for problem in failed:
            _say(f"error: {problem}")
        _finish(EXIT_INPUT, verbose, started, load_seconds)
    code = EXIT_HEALTHY if exit_zero else EXIT_BY_STATUS[diagnosis.status]
    _finish(code, verbose, started, load_seconds)


def _check_option_combinations(just_print: bool, output: Optional[Path], timeline: Optional[Path], explicit_format: bool,
                               selected_ranks: Optional[tuple[range, ...]], pg_filters: Optional[tuple[str, ...]],
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


def _plan_outputs(output: Optional[Path], timeline: Optional[Path], force: bool, inputs: list[Union[str, Path]],
                  html: Optional[Path] = None) -> list[OutputTarget]:
    targets = [plan_output(path, kind, force=force, input_roots=inputs)
               for path, kind in ((output, DATABASE), (timeline, TIMELINE), (html, HTML)) if path is not None]
    for i, first in enumerate(targets):
        for second in targets[i + 1:]:
            if os.path.realpath(first.path) == os.path.realpath(second.path):
                raise OutputError(f"{first.path}: {OUTPUT_FLAGS[first.kind]} and {OUTPUT_FLAGS[second.kind]} name the same file")
    return targets


def _selected_job_ranks(rank_ranges: Optional[tuple[range, ...]], job_ranks: Sequence[int]) -> Optional[list[int]]:
    if rank_ranges is None:
        return None
    ranks = ranks_in(rank_ranges, job_ranks)
    if not ranks:
        _note(f"note: --selected-ranks: none of those ranks is in this job (ranks {min(job_ranks)}-{max(job_ranks)})")
    return ranks


# What -o's extension made of the Database: torchfrtrace users expect a pickle whatever the name.
WRITTEN_AS = {"pickle": "pickle of (types, db)", "SQLite": "SQLite database; -o NAME.pkl writes a pickle"}


def _write_outputs(targets: list[OutputTarget], analysis: Analysis, diagnosis: Findings, ranks: Optional[list[int]],
                   filters: list[str], timeline_all: bool = False,
                   progress: Optional[Progress] = None, parts: Optional[ReportParts] = None) -> list[OutputError]:
    """Write each output; the OutputErrors of those that failed (the report still follows)."""
    # Imported when asked for (as the `diff` command's modules are): most runs write no
    # file, and every run pays for what it imports before the first dump is read.
    from frtrace.export.outputs import write_output
    from frtrace.export.timeline import choose_ranks

    progress = progress or Progress()
    failed: list[OutputError] = []
    for target in targets:
        # The same choice write_timeline makes: what the trace leaves out, and how to get it.
        note = choose_ranks(analysis, diagnosis, ranks, draw_all=timeline_all).note if target.kind == TIMELINE else None
        write = functools.partial(write_output, target, target.kind, analysis, diagnosis, ranks=ranks,
                                  pg_filters=filters, timeline_all=timeline_all, parts=parts)
        _write_one(target, write, note, progress, failed)
    return failed


def _write_made_outputs(made: tuple[MadeOutput, ...], files: "WorkerFiles", progress: Progress) -> list[OutputError]:
    """Write the files a cluster's worker made (cli/remote.py), read back from it a piece at
    a time (`files`: load.cluster.WorkerFiles), as _write_outputs writes them here; the
    OutputErrors of those that failed. Every file made is removed from the worker, even
    when this stops half way (an interrupt)."""
    from frtrace.export.outputs import write_made_output

    failed: list[OutputError] = []
    try:
        for output in made:
            file = output.file
            if file is None:
                failed.append(OutputError(output.error or f"{output.target.path}: not made"))
                continue
            # files.read is lazy: no piece is asked for before the write begins.
            write = functools.partial(write_made_output, output.target, files.read(file))
            _write_one(output.target, write, output.note, progress, failed)
    finally:
        for output in made:
            if output.file is not None:
                files.discard(output.file)
    return failed


def _write_one(target: OutputTarget, write: Callable[[], object], timeline_note: Optional[str], progress: Progress,
               failed: list[OutputError]) -> None:
    """`write()` the output at `target` with its progress phase (a database of thousands of
    ranks takes a while), then its notes; its OutputError into `failed`."""
    progress.phase(f"writing {target.path} ({WRITTEN_AS.get(target.format, target.format)})")
    try:
        write()
    except OutputError as exc:
        failed.append(exc)
        return
    finally:
        progress.clear()
    _note(f"wrote {target.path} ({WRITTEN_AS.get(target.format, target.format)})")
    if timeline_note:
        _note(timeline_note)


def _report_on_cluster(inputs: list[Union[str, Path]], scheduler: str, request: ReportRequest,
                       rank_ranges: Optional[tuple[range, ...]], progress: Progress, started: float, exit_zero: bool,
                       analyze_options: dict[str, Any]) -> NoReturn:
    """The run with --scheduler (see cli/remote.py)."""
    # Once the files are read, a worker matches and diagnoses them: minutes at 100,000 ranks.
    progress.after_reading = "matching and diagnosing on a worker of the dask cluster"
    failed: list[OutputError] = []

    def receive(outcome: RemoteReport, files: "WorkerFiles") -> None:
        # What a local run says once the analysis is done; the files are read back while
        # the cluster still holds them.
        progress.clear()
        for note in outcome.notes:
            _note(note)
        _selected_job_ranks(rank_ranges, outcome.job_ranks)
        failed.extend(_write_made_outputs(outcome.outputs, files, progress))

    outcome = on_cluster(inputs, functools.partial(report_on_worker, request), scheduler=scheduler,
                         progress=progress, receive=receive, **analyze_options)
    load_seconds = time.monotonic() - started
    if outcome.failure is not None:  # its notes are out (receive), and no file was made
        _fail(outcome.failure)
    _emit(outcome.report)
    if failed:
        # The report is out; the run still failed to do all it was asked (as a local run).
        for problem in failed:
            _say(f"error: {problem}")
        _finish(EXIT_INPUT, request.verbose, started, load_seconds)
    _finish(EXIT_HEALTHY if exit_zero else EXIT_BY_STATUS[outcome.status], request.verbose, started, load_seconds)
