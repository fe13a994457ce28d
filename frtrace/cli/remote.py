"""`--scheduler`: the report and the files asked for, made on the cluster.

Takes what the command was asked to print and write (`ReportRequest`, with its
`OutputRequest`); returns a `RemoteReport`: the notes the command prints on stderr, the
report, the status, the job's ranks and each file made (`MadeOutput`: where it lies on the
worker), made by `report_on_worker` on the Dask worker that holds the analysis (through
`frtrace.api.on_cluster`). Only these travel back, and the files a piece at a time as the
command writes them (load.cluster.WorkerFiles): the process the user started holds no
entry, however large the job, nor a whole file. Also `analysis_notes`, the stderr notes
of an analysis, which the local run prints the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional

from frtrace.api import Analysis, Diagnosis, diagnose
from frtrace.cli.render import RANK_VIEWS, REPORTS, RenderOptions
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


class ReportRequest(NamedTuple):
    """What to print: the format, --ranks, the renderers' options, -v; and what to write."""

    fmt: str
    ranks_only: bool
    options: RenderOptions
    verbose: bool
    outputs: OutputRequest = OutputRequest()


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


def report_on_worker(request: ReportRequest, analysis: Analysis) -> RemoteReport:
    """Diagnose, make the files and render where the analysis is (see module docstring)."""
    diagnosis = diagnose(analysis)
    render = (RANK_VIEWS if request.ranks_only else REPORTS)[request.fmt]
    job_ranks = tuple(analysis.layout.ranks_found) + tuple(analysis.layout.ranks_missing)
    made = make_outputs(request.outputs, analysis, diagnosis, job_ranks)
    return RemoteReport(tuple(analysis_notes(analysis, request.verbose)), render(diagnosis, request.options),
                        diagnosis.status, job_ranks, made)


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
                                       pg_filters=request.pg_filters, timeline_all=request.timeline_all)
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
