"""frtrace's Python API: diagnose a hung job from a notebook, a script or a service.

Takes dump paths (a directory, a file, an archive or a URL; one, or a list of them) and
the command's options as keywords; returns an `Analysis` (every dump read and matched
across ranks), a `Diagnosis` (status, suspects, findings, and the report as a dict,
JSON, text or markdown) and, for two dump sets of one job, a `Diff`. Nothing here
prints, exits or changes global state: every call can be repeated in one process, and
errors are `FrtraceError`s (`InputError` for the inputs).

    import frtrace
    analysis = frtrace.analyze("dumps/")        # a str, a Path, or a list of them
    diagnosis = frtrace.diagnose(analysis)
    diagnosis.status, diagnosis.suspect_ranks   # ('faults', (3,))
    print(diagnosis.to_text())

The command line (`frtrace.cli`) is a thin layer over these functions.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, TypeVar, Union

import click

from frtrace.diagnosis import Diagnosis as Findings
from frtrace.diagnosis import Finding
from frtrace.diagnosis import diagnose as run_rules
from frtrace.errors import FrtraceError, InputError, JobMismatch, OutputError
from frtrace.load.discovery import DEFAULT_MAX_FILE_BYTES
from frtrace.load.layout import MAX_WORLD_SIZE
from frtrace.load.sources import as_input, is_url
from frtrace.match.analysis import Analysis
from frtrace.load.loader import RemoteLoad, dispatch_load
from frtrace.match.analysis import analyze as run_pipeline
from frtrace.match.analysis import analyze_remote, load_layout
from frtrace.report.render import (
    DEFAULT_WIDTH as TEXT_WIDTH,
    RANK_VIEW_RENDERERS,
    ReportParts,
    render_json,
    render_markdown,
    render_text,
    report_dict,
)
from frtrace.util import cyclic_gc_paused, parse_size
from frtrace.wording import printable

if TYPE_CHECKING:
    from frtrace.load.cluster import WorkerFiles
    from frtrace.report.progress_diff import ProgressDiff

__all__ = [
    "TEXT_WIDTH", "Analysis", "Diagnosis", "Diff", "Finding", "FrtraceError", "InputError", "JobMismatch", "OutputError",
    "analyze", "diagnose", "diff", "exit_code", "on_cluster", "same_input",
]

PathLike = Union[str, "os.PathLike[str]"]
# One input, or several read together as one job.
Inputs = Union[PathLike, Iterable[PathLike]]
# Called as dump files are read: (files done, files in all).
Progress = Callable[[int, int], None]
# What a function run on the analysis returns (see on_cluster).
Result = TypeVar("Result")

# What the command exits with for each status (also `Diagnosis.exit_code`).
EXIT_BY_STATUS = {"healthy": 0, "faults": 1, "inconclusive": 3}


def exit_code(status: str) -> int:
    """0 healthy, 1 faults, 3 inconclusive: the command's exit code for a status."""
    return EXIT_BY_STATUS[status]


# --------------------------------------------------------------------------- analyse


def analyze(
    path_or_paths: Inputs,
    *,
    prefix: Optional[str] = None,
    world_size: Optional[int] = None,
    workers: Optional[int] = None,
    max_file_size: Union[int, str] = DEFAULT_MAX_FILE_BYTES,
    all_generations: bool = False,
    group_world_size: Optional[int] = None,
    scheduler: Optional[str] = None,
    progress: Optional[Progress] = None,
) -> Analysis:
    """Read every rank's dump under `path_or_paths` and match them across ranks.

    `path_or_paths`: a dump directory (searched recursively), a dump file, an archive
    (.tar, .tar.gz, .tgz, .zip) or a URL (s3://, gs://, file://), as a str or a Path, or
    a list of them. Keywords are the command's options: `prefix` (the file name before
    the rank number; inferred by default), `world_size` (when the highest ranks left no
    dump), `workers` (processes reading dumps; default the number of cores),
    `max_file_size` (bytes, or `"512M"`), `all_generations` (read dumps of several
    incidents together), `group_world_size` (torchft dumps: ranks per replica group),
    `scheduler` (a Dask scheduler address, or `"local:N"`), `progress(done, total)`.

    Raises `InputError` when a path does not exist or no usable dump is found.
    """
    inputs = input_list(path_or_paths)
    for name, value, top in (("world_size", world_size, MAX_WORLD_SIZE), ("group_world_size", group_world_size, None)):
        if value is not None and (value < 1 or (top is not None and value > top)):
            raise InputError(f"{name} must be a number of ranks from 1{f' to {top}' if top else ''}, not {value}")
    analysis = run_pipeline(
        inputs, prefix=prefix, world_size=world_size, workers=_workers(workers), max_bytes=_size(max_file_size),
        progress=progress, ft_group_world_size=group_world_size, all_generations=all_generations, scheduler=scheduler,
    )
    return _usable(analysis, inputs)


def _usable(analysis: Analysis, inputs: Sequence[Union[str, Path]]) -> Analysis:
    if not analysis.layout.ranks_found:
        # Every file was read but none has a believable rank: as with no readable file.
        unusable = analysis.load.errors + list(analysis.layout.ignored_files)
        where = ", ".join(str(p) for p in inputs)
        raise InputError(f"no usable dump in {where}: " + "; ".join(str(e) for e in unusable[:3]))
    return analysis


def on_cluster(
    path_or_paths: Inputs,
    then: Callable[[Analysis], Result],
    *,
    scheduler: str,
    prefix: Optional[str] = None,
    world_size: Optional[int] = None,
    max_file_size: Union[int, str] = DEFAULT_MAX_FILE_BYTES,
    all_generations: bool = False,
    group_world_size: Optional[int] = None,
    progress: Optional[Progress] = None,
    receive: Optional[Callable[[Result, "WorkerFiles"], None]] = None,
) -> Result:
    """`then(analyze(...))`, with the dumps read and analysed on the Dask cluster at
    `scheduler` (an address, or `"local:N"`): what `analyze(..., scheduler=)` does, except
    that the entries stay on the cluster. Its workers read and deal the dumps; one of them
    receives them all, matches them and runs `then` (a picklable function: a module-level
    one, or a functools.partial of one), whose result alone comes back. This process holds
    no entry, whatever the size of the job; the worker holds what `analyze` would.

        def verdict_of(analysis):            # in a module the workers can import
            return frtrace.diagnose(analysis).status

        status = frtrace.on_cluster("s3://bucket/dumps/", verdict_of, scheduler="tcp://10.0.0.5:8786")

    Keywords as for `analyze`; `progress(done, total)` is called as the files are read.
    Raises `InputError` as `analyze` does, and when the worker holding the analysis dies.

    Files `then` makes on its worker (frtrace.load.cluster.file_on_this_worker names one
    in its result) are read back by `receive(result, files)`, called here before the
    cluster is let go: `files.read(file)` yields a file's bytes a piece at a time, and
    `files.discard(file)` removes it from the worker.
    """
    from frtrace.load.cluster import DaskRunner, WorkerFiles  # dask is imported only when asked for

    inputs = input_list(path_or_paths)
    runner = DaskRunner.connect(scheduler)
    try:
        remote = dispatch_load(inputs, runner, prefix, max_bytes=_size(max_file_size), progress=progress,
                               all_generations=all_generations)
        # dask hands the task the results of the Futures among `remote.parts`, where it runs.
        result: Result = runner.run_task(_analysed_then, remote, then, inputs, world_size, group_world_size)
        if receive is not None:
            receive(result, WorkerFiles(runner))
        return result
    finally:
        runner.close()


def _analysed_then(remote: RemoteLoad, then: Callable[[Analysis], Result], inputs: Sequence[Union[str, Path]],
                   world_size: Optional[int], group_world_size: Optional[int]) -> Result:
    """On the worker (see on_cluster): the parts arrive as the batches' results."""
    with cyclic_gc_paused():  # as the command line runs: millions of objects, no cycles
        analysis = _usable(analyze_remote(remote, world_size=world_size, ft_group_world_size=group_world_size),
                           inputs)
        result = then(analysis)
    # Freeing every entry takes seconds at thousands of ranks: done by a thread of its own,
    # after the result has gone back.
    held = [analysis, remote]
    del analysis, remote
    threading.Thread(target=held.clear, name="frtrace-release", daemon=True).start()
    return result


def input_list(path_or_paths: Inputs) -> list[Union[str, Path]]:
    """The inputs as the loader takes them (URLs stay strings; a str is one path, never
    a list of characters); InputError for a path that does not exist or for none."""
    if isinstance(path_or_paths, (str, bytes, os.PathLike)):
        items: list[object] = [path_or_paths]
    elif isinstance(path_or_paths, Iterable):
        items = list(path_or_paths)
    else:
        raise TypeError(f"expected a path or a list of paths, not {type(path_or_paths).__name__}")
    if not items:
        raise InputError("no input given: name a dump directory, file, archive or URL")
    inputs = []
    for item in items:
        if not isinstance(item, (str, bytes, os.PathLike)):
            raise TypeError(f"expected a path, not {type(item).__name__}: {item!r}")
        path = as_input(os.fsdecode(item))
        if not is_url(path) and not os.path.lexists(path):
            raise InputError(f"{printable(str(path))}: no such directory or file")
        inputs.append(path)
    return inputs


def _workers(workers: Optional[int]) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if workers < 1:
        raise InputError(f"workers must be 1 or more, not {workers}")
    return workers


def _size(size: Union[int, str]) -> int:
    if isinstance(size, int):
        if size <= 0:
            raise InputError(f"max_file_size must be a positive number of bytes, not {size}")
        return size
    try:
        return parse_size(size)
    except ValueError:
        raise InputError(f"max_file_size takes a size such as 512M or 4G, not {size!r}") from None


# --------------------------------------------------------------------------- diagnose


@dataclass(frozen=True)
class Diagnosis:
    """What the rules found in an `Analysis`, and the report in each format.

    `status` is `healthy`, `faults` or `inconclusive`; `suspect_ranks` the primary
    suspects; `verdict` the report's first line; `findings` roots first, then
    consequences, then notes (each a `Finding` with `kind`, `rule`, `pg_name`, `op`,
    `collective_seq_id`, `ranks`, `suspect_ranks`, `message`, `evidence`).
    """

    analysis: Analysis = field(repr=False)
    outcome: Findings = field(repr=False)
    # What the reports read of the analysis alone (see ReportParts): readied during the
    # diagnosis where it waits for forked rules, else worked out when first rendered.
    parts: Optional[ReportParts] = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", ReportParts.of(self.analysis, self.parts))

    @property
    def status(self) -> str:
        return self.outcome.status

    @property
    def suspect_ranks(self) -> tuple[int, ...]:
        return self.outcome.suspect_ranks

    @property
    def verdict(self) -> str:
        return self.outcome.verdict

    @property
    def findings(self) -> list[Finding]:
        return self.outcome.findings

    @property
    def exit_code(self) -> int:
        """What `frtrace` exits with for this diagnosis: 0 healthy, 1 faults, 3 inconclusive."""
        return exit_code(self.status)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as Python data (schema `frtrace.report/1`)."""
        return report_dict(self.analysis, self.outcome)

    def to_json(self) -> str:
        """The JSON report, as `frtrace --format json` prints it."""
        return render_json(self.analysis, self.outcome, self.parts)

    def to_text(self, *, verbose: bool = False, mismatch_cap: Optional[int] = None, color: bool = False,
                width: Optional[int] = None, show_all: bool = False) -> str:
        """The text report, as `frtrace` prints it (`verbose`: name each finding's rule and
        list everything; `mismatch_cap`: at most that many findings per group; `color`: ANSI
        colours; `width`: columns to wrap to, TEXT_WIDTH by default; `show_all`: every finding
        and row rather than one screen)."""
        return render_text(self.analysis, self.outcome, mismatch_cap, _styler(color), verbose,
                           width or TEXT_WIDTH, show_all, self.parts)

    def to_markdown(self, *, mismatch_cap: Optional[int] = None) -> str:
        """The markdown report, as `frtrace --format markdown` prints it."""
        return render_markdown(self.analysis, self.outcome, mismatch_cap, self.parts) + "\n"

    def ranks(self, format: str = "text", *, color: bool = False, width: Optional[int] = None) -> str:
        """Where each rank is, folded into rows of ranks that stand alike, after the
        verdict (`frtrace --ranks`): `format` is text, json or markdown; `ranks` gives only
        the suspect ranks on one line (`frtrace --format ranks`)."""
        if format not in RANK_VIEW_RENDERERS:
            raise ValueError(f"format must be one of {', '.join(RANK_VIEW_RENDERERS)}, not {format!r}")
        render = RANK_VIEW_RENDERERS[format]
        return str(render(self.analysis, self.outcome, style=_styler(color), width=width or TEXT_WIDTH,  # type: ignore[operator]
                          parts=self.parts))


def diagnose(analysis: Analysis, *, processes: int = 1) -> Diagnosis:
    """Run the diagnosis rules over an `Analysis` (see README "How it decides").
    `processes` of 4 or more lets the costliest rules of a large job run in forked
    children meanwhile (where the system forks); the diagnosis is the same."""
    if not isinstance(analysis, Analysis):
        raise TypeError(f"diagnose takes the Analysis that frtrace.analyze returned, not {type(analysis).__name__}")
    if processes < 1:
        raise InputError(f"processes must be 1 or more, not {processes}")
    parts = ReportParts(analysis)
    meanwhile = None if parts.work_out_apart(processes) else parts.ready
    return Diagnosis(analysis, run_rules(analysis, processes, meanwhile=meanwhile), parts)


def _styler(color: bool) -> Optional[Callable[..., str]]:
    return click.style if color else None


# --------------------------------------------------------------------------- diff


@dataclass(frozen=True)
class Diff:
    """Which ranks and groups made no progress between two dump sets of one job.

    `status`: `healthy` (every rank moved on), `faults` (some made no progress) or
    `inconclusive`; `verdict` the report's first line; `progress` the comparison
    itself (per rank and per group: moved, stuck, idle or unknown, and why); `notes`
    what the command would print on stderr about the inputs (skipped files, other
    generations), each beginning with OLD or NEW.
    """

    progress: "ProgressDiff" = field(repr=False)
    old_name: str
    new_name: str
    notes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # files that are no dumps (`-v` lists them)

    @property
    def status(self) -> str:
        return self.progress.status

    @property
    def verdict(self) -> str:
        return self.progress.verdict

    @property
    def exit_code(self) -> int:
        return exit_code(self.status)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as Python data (schema `frtrace.diff/1`)."""
        return dict(json.loads(self.to_json()))

    def to_json(self) -> str:
        """The JSON report, as `frtrace diff --format json` prints it."""
        from frtrace.report.diff_render import render_diff_json

        return render_diff_json(self.progress)

    def to_text(self, *, color: bool = False) -> str:
        """The text report, as `frtrace diff` prints it: the verdict, then a table."""
        from frtrace.report.diff_render import render_diff_text

        return render_diff_text(self.progress, self.old_name, self.new_name, _styler(color))

    def to_markdown(self) -> str:
        from frtrace.report.diff_render import render_diff_markdown

        return render_diff_markdown(self.progress, self.old_name, self.new_name)


def diff(
    old: Inputs,
    new: Inputs,
    *,
    prefix: Optional[str] = None,
    workers: Optional[int] = None,
    max_file_size: Union[int, str] = DEFAULT_MAX_FILE_BYTES,
    progress: Optional[Progress] = None,
) -> Diff:
    """Compare two dump sets of one job taken apart (a hang dumped twice): which ranks
    are stuck in the op they already waited in, stood idle, or moved on.

    `old` and `new` are inputs as `analyze` takes them. Only what the comparison needs
    is kept of each set (no match across ranks). Raises `InputError` for unusable
    inputs (the message begins with OLD or NEW) and `JobMismatch` when NEW is not a
    later dump of OLD's run.
    """
    old_paths, new_paths = _side_inputs("OLD", old), _side_inputs("NEW", new)
    if len(old_paths) == len(new_paths) and all(map(same_input, old_paths, new_paths)):
        raise InputError(f"OLD and NEW are the same input ({_names(old_paths)}): give two dumps of the job taken apart")
    sides, notes, ignored = [], [], []
    for label, paths in (("OLD", old_paths), ("NEW", new_paths)):
        try:
            loaded = load_layout(paths, prefix=prefix, workers=_workers(workers), max_bytes=_size(max_file_size),
                                 progress=progress)
        except InputError as exc:
            raise InputError(f"{label}: {exc}") from None
        if not loaded.layout.ranks_found:
            raise InputError(f"{label}: no usable dump in {_names(paths)}")
        notes += [f"{label}: {note}" for note in loaded.load.notes]
        notes += [f"{label}: skipped {issue}" for issue in loaded.unusable]
        ignored += [f"{label}: ignored {issue}" for issue in loaded.load.skipped]
        sides.append(loaded)
    # Imported when asked for: most runs compare nothing, and every run pays for what it
    # imports before the first dump is read.
    from frtrace.report.progress_diff import diff_progress

    return Diff(diff_progress(*sides), _names(old_paths), _names(new_paths), tuple(notes), tuple(ignored))


def _side_inputs(label: str, inputs: Inputs) -> list[Union[str, Path]]:
    try:
        return input_list(inputs)
    except InputError as exc:
        raise InputError(f"{label}: {exc}") from None


def same_input(first: Union[str, Path], second: Union[str, Path]) -> bool:
    """Whether two inputs name the same place (local paths after links are followed)."""
    if is_url(first) or is_url(second):
        return str(first) == str(second)
    return os.path.realpath(first) == os.path.realpath(second)


def _names(paths: Sequence[object]) -> str:
    return ", ".join(str(p) for p in paths)
