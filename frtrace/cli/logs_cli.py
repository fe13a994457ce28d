"""The command line's part for logs: `frtrace job.log`, a directory of logs, `--logs PATH`.

Takes the inputs the user gave; tells log files from dumps (`split_log_inputs`), runs
a report from logs alone (`run_logs_only`), or adds logs to a dump report
(`add_logs`, `render_with_logs`). Errors are one line on stderr and exit 2, as for dumps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Union

import click

from frtrace.diagnosis import Diagnosis
from frtrace.diagnosis.logs import diagnose_logs, with_dumps
from frtrace.export.paths import HTML, OutputError, plan_output, write_atomically
from frtrace.logs import LogEvidence, LogInputError, has_log_files, is_log_file, read_logs
from frtrace.match.analysis import Analysis
from frtrace.report.logs_report import (
    render_logs_html,
    render_logs_json,
    render_logs_markdown,
    render_logs_ranks,
    render_logs_text,
    render_with_logs,
)

__all__ = ["LogRun", "add_logs", "logs_in_dump_inputs", "render_with_logs", "run_logs_only", "split_log_inputs"]


class LogRun(NamedTuple):
    """What a logs-only run needs from the command line."""

    fmt: str
    ranks_only: bool
    mismatch_cap: Optional[int]
    world_size: Optional[int]
    html: Optional[Path]
    force: bool
    exit_zero: bool
    verbose: bool


# Files named like logs are looked at before the dumps are read; any other file only if no
# dump was found (a job of 16,384 dump files given by name costs no extra read).
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".log.gz", ".txt.gz", ".out.gz", ".err.gz", ".log.bz2", ".log.xz")


def split_log_inputs(inputs: list[Union[str, Path]], logs: tuple[str, ...]) -> tuple[list[Union[str, Path]], list[Path]]:
    """(dump inputs, log paths): files named like logs that read as text logs move to the
    logs; `--logs` paths are logs. Directories and other files stay dump inputs (see
    logs_in_dump_inputs)."""
    dump_inputs, log_paths = [], [Path(p) for p in logs]
    for item in inputs:
        if (isinstance(item, Path) and item.name.lower().endswith(LOG_SUFFIXES) and item.is_file()
                and is_log_file(item)):
            log_paths.append(item)
        else:
            dump_inputs.append(item)
    return dump_inputs, log_paths


def logs_in_dump_inputs(inputs: list[Union[str, Path]]) -> list[Path]:
    """The directories holding logs and the log files among dump inputs: asked only once no
    dump was found in them, so that dumps are read exactly as before."""
    return [item for item in inputs if isinstance(item, Path)
            and ((item.is_dir() and has_log_files(item)) or (item.is_file() and is_log_file(item)))]


def read_evidence(log_paths: list[Path], world_size: Optional[int], fail: Callable[[str], None]) -> LogEvidence:
    try:
        return read_logs(log_paths, world_size=world_size)
    except LogInputError as exc:
        fail(str(exc))
        raise  # fail exits; this keeps the type checker honest


def add_logs(analysis: Analysis, diagnosis: Diagnosis, log_paths: list[Path], world_size: Optional[int],
             fail: Callable[[str], None], note: Callable[[str], None]) -> tuple[Diagnosis, LogEvidence]:
    """The dump diagnosis with the logs' evidence added (frtrace.diagnosis.logs.with_dumps)."""
    evidence = read_evidence(log_paths, world_size or analysis.layout.world_size, fail)
    for line in evidence.notes:
        note(f"logs: {line}")
    return with_dumps(analysis, diagnosis, evidence), evidence


def run_logs_only(log_paths: list[Path], run: LogRun, emit: Callable[[str], None], fail: Callable[[str], None],
                  note: Callable[[str], None], styler: Optional[Callable[..., str]], started: float, no_job_error: str = "") -> int:
    """Read the logs, diagnose, print the report; the exit code (0/1/3, 2 on errors).
    Logs with no line of a distributed job in them fail with `no_job_error` (or say so)."""
    html_target = None
    if run.html is not None:
        try:
            html_target = plan_output(run.html, HTML, force=run.force, input_roots=log_paths)
        except OutputError as exc:
            fail(str(exc))
    evidence = read_evidence(log_paths, run.world_size, fail)
    # A directory tried as logs because it held no usable dump must hold lines of a job's
    # watchdog, NCCL or launcher; anything less and the dump loader's error stands.
    said = any(log.lines for log in evidence.ranks.values()) if no_job_error else bool(evidence.ranks)
    if not said:
        fail(no_job_error or (", ".join(map(str, log_paths)) + ": no line of a distributed job (no rank prefix, watchdog, "
                              "NCCL or launcher line)"))
    for line in evidence.notes:
        note(f"logs: {line}")
    diagnosis = diagnose_logs(evidence)
    failed = False
    if html_target is not None:
        try:
            write_atomically(html_target, lambda tmp: Path(tmp).write_text(render_logs_html(evidence, diagnosis)))
            note(f"wrote {html_target.path} (HTML report)")
        except (OSError, OutputError) as exc:
            failed = True
            note(f"error: {html_target.path}: cannot write ({exc})")
    if run.fmt == "ranks":  # for alert scripts: the suspects alone, on one line
        emit(" ".join(map(str, diagnosis.suspect_ranks)) + "\n")
    elif run.ranks_only:
        emit(render_logs_ranks(evidence, diagnosis, run.fmt, styler))
    elif run.fmt == "json":
        emit(render_logs_json(evidence, diagnosis))
    elif run.fmt == "markdown":
        emit(render_logs_markdown(evidence, diagnosis, run.mismatch_cap) + "\n")
    else:
        emit(render_logs_text(evidence, diagnosis, run.mismatch_cap, styler, run.verbose))
    if run.verbose:
        note(f"{time.monotonic() - started:.2f}s total (logs)")
    if failed:
        return 2
    return 0 if run.exit_zero else {"healthy": 0, "faults": 1, "inconclusive": 3}[diagnosis.status]


def refuse_dump_only_options(output: Optional[Path], timeline: Optional[Path], just_print: bool) -> None:
    """-o, --timeline and -j need dumps."""
    given = [flag for flag, value in (("-o", output), ("--timeline", timeline), ("-j", just_print)) if value]
    if given:
        raise click.UsageError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} Flight Recorder dumps; "
                               "these inputs are logs only")


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()
