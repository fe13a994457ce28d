"""`--scheduler` with nothing to write but the report: the report made on the cluster.

Takes what the command was asked to print (`ReportRequest`); returns a `RemoteReport`:
the notes the command prints on stderr, the report, the status and the job's ranks,
made by `report_on_worker` on the Dask worker that holds the analysis (through
`frtrace.api.on_cluster`). Only these travel back: the process the user started holds
no entry, however large the job. Also `analysis_notes`, the stderr notes of an analysis,
which the local run prints the same way.
"""

from __future__ import annotations

from typing import NamedTuple

from frtrace.api import Analysis, diagnose
from frtrace.cli.render import RANK_VIEWS, REPORTS, RenderOptions

# Without -v, a job whose every dump has the same odd field gets a few lines, not thousands.
ODD_FIELD_NOTES = 3


class ReportRequest(NamedTuple):
    """What to print: the format, --ranks, the renderers' options, -v."""

    fmt: str
    ranks_only: bool
    options: RenderOptions
    verbose: bool


class RemoteReport(NamedTuple):
    notes: tuple[str, ...]  # stderr lines, in the order a local run prints them
    report: str
    status: str
    job_ranks: tuple[int, ...]  # ranks found and missing


def report_on_worker(request: ReportRequest, analysis: Analysis) -> RemoteReport:
    """Diagnose and render where the analysis is (see module docstring)."""
    diagnosis = diagnose(analysis)
    render = (RANK_VIEWS if request.ranks_only else REPORTS)[request.fmt]
    job_ranks = tuple(analysis.layout.ranks_found) + tuple(analysis.layout.ranks_missing)
    return RemoteReport(tuple(analysis_notes(analysis, request.verbose)), render(diagnosis, request.options),
                        diagnosis.status, job_ranks)


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
