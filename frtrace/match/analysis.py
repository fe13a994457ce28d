"""Run the stages in order: the one entry point the CLI and other tools call.

Takes input paths and options; returns an `Analysis` holding every stage's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from frtrace.load.discovery import RankFile
from frtrace.load.layout import Layout, build_layout
from frtrace.load.loader import (
    DEFAULT_MAX_FILE_BYTES,
    Discovery,
    InputError,
    RemoteLoad,
    load_dump_files,
    load_dumps,
)
from frtrace.load.normalise import count_collectives_apart_from_batches, settle_only_active_job
from frtrace.match.matcher import DealtDumps, MatchResult, match, rematch
from frtrace.model import LoadIssue, PgConfig
from frtrace.table.rank_dump import LoadResult, RankDump
from frtrace.table.standing import completion_is_reliable, without_queued_ops


@dataclass(slots=True)
class LoadedJob:
    """The dumps of one job as read, and its layout: what `frtrace diff` compares (no
    match across ranks)."""

    load: LoadResult
    layout: Layout

    @property
    def dumps(self) -> list[RankDump]:
        """The dumps that take part (the builder sets aside files with an implausible rank)."""
        return self.layout.usable(self.load.dumps)

    @property
    def world_size(self) -> int:
        return int(self.layout.world_size)

    @property
    def ranks_found(self) -> tuple[int, ...]:
        """Ranks with a usable dump."""
        return tuple(self.layout.ranks_found)

    @property
    def ranks_missing(self) -> tuple[int, ...]:
        """Ranks of the job without a usable dump (no file, or an unreadable one)."""
        return tuple(self.layout.ranks_missing)

    @property
    def unusable(self) -> list[LoadIssue]:
        """Dump files that could not be used, each with the reason."""
        return list(self.load.errors) + list(self.layout.ignored_files)


@dataclass(slots=True)
class Analysis(LoadedJob):
    """A job's dumps read, laid out and matched across ranks: what the diagnosis takes."""

    matches: MatchResult  # of everything dumped: what the report and the Database show
    # Whether the dumps say when ops finish (gloo's do not): without it nothing tells a
    # blocked op from a queued one, and the device view is the full one.
    reliable: bool
    # The dumps as each rank's device got them (no ops queued behind the blocked one),
    # and their match: what the diagnosis reasons on. The same objects as `matches` and
    # the usable dumps when no rank queued anything.
    device_dumps: list[RankDump]
    device: MatchResult


def analyze(
    inputs: Sequence[object],
    *,
    prefix: Optional[str] = None,
    world_size: Optional[int] = None,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: Optional[Callable[[int, int], None]] = None,
    ft_group_world_size: Optional[int] = None,
    all_generations: bool = False,
    scheduler: Optional[str] = None,
) -> Analysis:
    """Load, build and match. Raises InputError when nothing usable was found.

    `ft_group_world_size` handles torchft dumps, whose pg_config ranks are local to
    each replica group of that many ranks. `all_generations` reads every generation of
    dumps found together (see loader.discover_dump_files). `scheduler` (a dask scheduler
    address, or `local[:N]`) reads and normalises the files on a dask cluster's workers
    instead of local processes (see load/cluster.py); the rest runs here either way.
    """
    # Each dump is dealt into its groups as it arrives, while the workers decode the next.
    dealt = DealtDumps()
    runner = None
    if scheduler is not None:
        from frtrace.load.cluster import DaskRunner  # dask is imported only when asked for

        runner = DaskRunner.connect(scheduler)
    try:
        loaded = load_dumps(inputs, prefix, workers=workers, max_bytes=max_bytes, progress=progress,
                            on_dump=dealt.add,
                            all_generations=all_generations, runner=runner)
    finally:
        if runner is not None:
            runner.close()  # the workers' memory goes back before matching starts
    # A dask client runs threads, which a fork would copy mid-step: match in one process there.
    return _analysed(loaded, dealt, inputs, world_size, ft_group_world_size,
                     processes=workers if runner is None else 1)


def analyze_remote(remote: RemoteLoad, *, world_size: Optional[int] = None,
                   ft_group_world_size: Optional[int] = None) -> Analysis:
    """`analyze` of dumps read on a cluster (loader.dispatch_load), on the worker of that
    cluster that received them: what --scheduler runs there, so that the entries never
    travel to the process that asked."""
    dealt = DealtDumps()
    loaded = remote.taken(on_dump=dealt.add)
    return _analysed(loaded, dealt, remote.inputs, world_size, ft_group_world_size)


def _analysed(loaded: LoadResult, dealt: DealtDumps, inputs: Sequence[object], world_size: Optional[int],
              ft_group_world_size: Optional[int], processes: int = 1) -> Analysis:
    if ft_group_world_size:
        loaded.dumps = [_globalise_ft_ranks(d, ft_group_world_size) for d in loaded.dumps]
    _check_loaded(loaded, inputs)
    loaded.dumps = count_collectives_apart_from_batches(loaded.dumps)
    settle_only_active_job(loaded.dumps)
    layout = build_layout(loaded.dumps, loaded.failed_ranks, world_size)
    matches = match(loaded.dumps, layout, dealt, processes=processes)
    return finish_analysis(loaded, layout, matches)


def load_layout(
    inputs: Sequence[object],
    *,
    prefix: Optional[str] = None,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: Optional[Callable[[int, int], None]] = None,
) -> LoadedJob:
    """Load and lay out, without matching: what a comparison of two dump sets needs.
    Raises InputError when nothing usable was found."""
    loaded = load_dumps(inputs, prefix, workers=workers, max_bytes=max_bytes, progress=progress)
    _check_loaded(loaded, inputs)
    return LoadedJob(loaded, build_layout(loaded.dumps, loaded.failed_ranks, None))


def match_files(
    files: list[RankFile],
    found: Discovery,
    *,
    world_size: Optional[int] = None,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: Optional[Callable[[int, int], None]] = None,
    ft_group_world_size: Optional[int] = None,
) -> tuple[LoadResult, Layout, MatchResult]:
    """Load, build and match only `files` (a selection of `found.files`, chosen by the
    rank in their names): what `-j --selected-ranks` shows side by side. No device view,
    no diagnosis. The other ranks are missing to the layout; their files are never read."""
    dealt = DealtDumps()
    loaded = load_dump_files(files, found, workers=workers, max_bytes=max_bytes, progress=progress,
                             on_dump=dealt.add)
    if ft_group_world_size:
        loaded.dumps = [_globalise_ft_ranks(d, ft_group_world_size) for d in loaded.dumps]
    loaded.dumps = count_collectives_apart_from_batches(loaded.dumps)
    settle_only_active_job(loaded.dumps)
    layout = build_layout(loaded.dumps, loaded.failed_ranks, world_size)
    return loaded, layout, match(loaded.dumps, layout, dealt)


def _check_loaded(loaded: LoadResult, inputs: Sequence[object]) -> None:
    if not loaded.dumps:
        where = ", ".join(str(p) for p in inputs)
        if loaded.errors:
            raise InputError(f"no usable dump in {where}: " + "; ".join(str(e) for e in loaded.errors[:3]))
        raise InputError(f"no Flight Recorder dump files found in {where}")


def finish_analysis(loaded: LoadResult, layout: Layout, matches: MatchResult) -> Analysis:
    """The `Analysis` of loaded dumps, their layout and their match: adds the device view
    (re-matching only the groups of ranks that queued ops behind the one they block in)."""
    dumps = layout.usable(loaded.dumps)
    reliable = completion_is_reliable(dumps)
    if not reliable:
        return Analysis(loaded, layout, matches, reliable, dumps, matches)
    trimmed = [without_queued_ops(d) for d in dumps]
    changed = {t.rank for t, d in zip(trimmed, dumps) if t is not d}
    return Analysis(loaded, layout, matches, reliable, trimmed, rematch(matches, trimmed, changed))


def _globalise_ft_ranks(dump: RankDump, group_world_size: int) -> RankDump:
    base = (dump.rank // group_world_size) * group_world_size
    dump.pg_config = tuple(
        PgConfig(c.name, c.desc, tuple(base + r for r in c.ranks) if c.ranks else c.ranks) for c in dump.pg_config
    )
    return dump
