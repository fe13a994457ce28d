"""`--scheduler`: the report and the files asked for, made on the cluster.

Takes what the command was asked to print and write (`ReportRequest`, with its
`OutputRequest`, and the logs to read as evidence too: `LogsRequest`); returns a `RemoteReport`: the notes the command prints on stderr, the
report, the status, the job's ranks and each file made (`MadeOutput`: where it lies on the
worker), made by `report_on_worker` on the Dask worker that holds the analysis (through
`frtrace.api.on_cluster`). Only these travel back, and the files a piece at a time as the
command writes them (load.cluster.WorkerFiles): the process the user started holds no
entry, however large the job, nor a whole file. Also `analysis_notes`, the stderr notes
of an analysis, which the local run prints the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Optional

import click

from frtrace.api import Analysis, Diagnosis, diagnose
from frtrace.cli.render import RANK_VIEWS, REPORTS, RenderOptions
from frtrace.diagnosis.logs import with_dumps
from frtrace.logs import LogEvidence, LogInputError, read_logs
from frtrace.report.logs_report import render_with_logs
from frtrace.export.paths import TIMELINE, OutputError, OutputTarget
from frtrace.util import ranks_in

if TYPE_CHECKING:
    from frtrace.load.cluster import WorkerFile

# Without -v, a job whose every dump has the same odd field gets a few lines, not thousands.
ODD_FIELD_NOTES = 3


class OutputRequest(NamedTuple):
    """The files to write (-o, --timeline, --html: checked here before any dump is read)
    and what narrows the timeline: --selected-ranks, --pg-filters, --timeline-all."""

    targets: tuple[OutputTarget, ...] = ()
    rank_ranges: Optional[tuple[range, ...]] = None
    pg_filters: tuple[str, ...] = ()
    timeline_all: bool = False


class LogsRequest(NamedTuple):
    """--logs, read where the analysis is: each input by the absolute path a worker reads
    it by (`paths`) and as the command was given it (`shown`, what the report and the
    notes name); --world-size, when given."""

    paths: tuple[str, ...]
    shown: tuple[str, ...]
    world_size: Optional[int] = None

    def as_given(self, text: str) -> str:
        """`text` naming each log input as given, not as the worker read it."""
        for read, shown in sorted(zip(self.paths, self.shown), key=lambda pair: -len(pair[0])):
            text = text.replace(read, shown)
        return text


class ReportRequest(NamedTuple):
    """What to print: the format, --ranks, the renderers' options, -v; what to write; and
    the logs to read as evidence too."""

    fmt: str
    ranks_only: bool
    options: RenderOptions
    verbose: bool
    outputs: OutputRequest = OutputRequest()
    logs: Optional[LogsRequest] = None


class MadeOutput(NamedTuple):
    """One file made where the analysis is: the file, on that worker's disk, or why it
    could not be made; and for a timeline, what it leaves out (choose_ranks's note)."""

    target: OutputTarget
    file: Optional[WorkerFile]
    error: Optional[str]
    note: Optional[str]


class RemoteReport(NamedTuple):
    notes: tuple[str, ...]  # stderr lines, in the order a local run prints them
    report: str
    status: str
    job_ranks: tuple[int, ...]  # ranks found and missing
    outputs: tuple[MadeOutput, ...] = ()  # in the order asked
    failure: Optional[str] = None  # why the run failed before its report (the logs could not be read)


def report_on_worker(request: ReportRequest, analysis: Analysis) -> RemoteReport:
    """Diagnose, make the files and render where the analysis is (see module docstring)."""
    diagnosis = diagnose(analysis)
    notes = analysis_notes(analysis, request.verbose)
    job_ranks = tuple(analysis.layout.ranks_found) + tuple(analysis.layout.ranks_missing)
    evidence = None
    if request.logs is not None:
        try:
            evidence = _read_logs_here(request.logs, analysis)
        except LogInputError as exc:
            return RemoteReport(tuple(notes), "", diagnosis.status, job_ranks, failure=request.logs.as_given(str(exc)))
        notes += [f"logs: {line}" for line in evidence.notes]
        diagnosis = Diagnosis(analysis, with_dumps(analysis, diagnosis.outcome, evidence), diagnosis.parts)
    made = make_outputs(request.outputs, analysis, diagnosis, job_ranks)
    return RemoteReport(tuple(notes), _rendered(request, analysis, diagnosis, evidence), diagnosis.status, job_ranks, made)


def _read_logs_here(logs: LogsRequest, analysis: Analysis) -> LogEvidence:
    """The logs' evidence, read by absolute path, naming the files and saying its notes as
    the command was given them (a local run reads them relative to where it runs)."""
    evidence = read_logs([Path(path) for path in logs.paths], world_size=logs.world_size or analysis.layout.world_size)
    evidence.files[:] = [log._replace(path=logs.as_given(log.path)) for log in evidence.files]
    evidence.notes[:] = [logs.as_given(line) for line in evidence.notes]
    return evidence


def _rendered(request: ReportRequest, analysis: Analysis, diagnosis: Diagnosis, evidence: Optional[LogEvidence]) -> str:
    """The report as the local run prints it (with the logs' part when they were read)."""
    if evidence is not None and not request.ranks_only and request.fmt != "ranks":
        options = request.options
        return render_with_logs(request.fmt, analysis, diagnosis.outcome, evidence, options.mismatch_cap,
                                click.style if options.color else None, options.verbose,
                                options.width, options.show_all, diagnosis.parts)
    return (RANK_VIEWS if request.ranks_only else REPORTS)[request.fmt](diagnosis, request.options)


def make_outputs(request: OutputRequest, analysis: Analysis, diagnosis: Diagnosis,
                 job_ranks: tuple[int, ...]) -> tuple[MadeOutput, ...]:
    """Each file of `request`, made on this machine as the local run writes it, left for
    the process that asked to read back (load.cluster.WorkerFiles)."""
    if not request.targets:
        return ()
    # Imported when asked for, as the local run does: most runs write no file.
    from frtrace.export.outputs import make_output_file
    from frtrace.export.timeline import choose_ranks
    from frtrace.load.cluster import file_on_this_worker

    ranks = None if request.rank_ranges is None else ranks_in(request.rank_ranges, job_ranks)
    made = []
    for target in request.targets:
        note = None
        try:
            made_at = make_output_file(target, analysis, diagnosis.outcome, ranks=ranks,
                                       pg_filters=request.pg_filters, timeline_all=request.timeline_all,
                                       parts=diagnosis.parts)
        except OutputError as exc:
            made.append(MadeOutput(target, None, str(exc), None))
            continue
        if target.kind == TIMELINE:
            note = choose_ranks(analysis, diagnosis.outcome, ranks, draw_all=request.timeline_all).note
        made.append(MadeOutput(target, file_on_this_worker(made_at), None, note))
    return tuple(made)


def analysis_notes(analysis: Analysis, verbose: bool) -> list[str]:
    """The stderr notes of a loaded job: the loader's notes, the files skipped, dumps with odd
    fields (a few, or all with -v), and with -v the files ignored."""
    notes = list(analysis.load.notes)
    notes += [f"skipped {issue}" for issue in analysis.unusable]
    odd = [dump for dump in analysis.load.dumps if dump.warnings]
    shown = odd if verbose else odd[:ODD_FIELD_NOTES]
    notes += [f"odd fields in {dump.path}: {'; '.join(dump.warnings)}" for dump in shown]
    if len(odd) > len(shown):
        notes.append(f"... and {len(odd) - len(shown)} more dumps with odd fields (-v lists them all; "
                     "also in inputs.warnings of --format json)")
    if verbose:
        notes += [f"ignored {issue}" for issue in analysis.load.skipped]
    return notes
