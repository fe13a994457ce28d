"""`frtrace -j`: the raw entries, side by side or a block per rank, without a diagnosis.

Takes the inputs and -j's options (`RawOptions`); reads only the files of the selected
ranks (chosen by the rank in their names) and writes the entries to stdout as each
rank's file is read. Exits 0 unless no dump could be read (2).
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple, NoReturn, Optional, Union

from frtrace.cli.output import EXIT_HEALTHY, _emit, _emit_block, _emit_lines, _fail, _finish, _note
from frtrace.cli.progress import Progress
from frtrace.errors import InputError
from frtrace.load.discovery import RankFile
from frtrace.load.loader import discover_dump_files, iter_dump_files, select_files
from frtrace.load.sources import as_input
from frtrace.match.analysis import match_files
from frtrace.model import LoadIssue
from frtrace.table.rank_dump import RankDump
from frtrace.report.raw_view import (
    DEFAULT_LAST,
    SIDE_BY_SIDE_MAX,
    RenderedBlock,
    StackNumbers,
    rank_block_lines,
    render_block,
    side_by_side_lines,
)
from frtrace.util import fold_ranks, ranks_in


class RawOptions(NamedTuple):
    inputs: list[Union[str, Path]]
    prefix: Optional[str]
    all_generations: bool
    rank_ranges: Optional[tuple[range, ...]]
    filters: list[str]
    print_stack: bool
    per_rank: Optional[bool]  # None: chosen by the number of ranks and the terminal's width
    last: Optional[int]
    world_size: Optional[int]
    workers: int
    max_bytes: int
    ft_group_world_size: Optional[int]
    verbose: bool


def _print_raw_entries(opts: RawOptions, started: float, progress: Optional[Progress] = None) -> NoReturn:
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
        _finish(EXIT_HEALTHY, opts.verbose, started, time.monotonic() - started)
    if opts.per_rank is False and len(files) > SIDE_BY_SIDE_MAX:
        _fail(f"--side-by-side shows at most {SIDE_BY_SIDE_MAX} ranks, not {len(files)} "
              "(choose them with --selected-ranks, or leave it out for one block per rank)")
    if opts.per_rank or len(files) > SIDE_BY_SIDE_MAX:
        for issue in found.refused:  # archive members refused by name or kind (the table's load says them)
            _note(f"skipped {issue}")
        _print_rank_blocks(files, opts, started)
    progress = progress or Progress()
    loaded, layout, matches = match_files(files, found, world_size=opts.world_size, workers=opts.workers,
                                          max_bytes=opts.max_bytes, progress=progress,
                                          ft_group_world_size=opts.ft_group_world_size)
    progress.clear()
    load_seconds = time.monotonic() - started
    for issue in loaded.errors + list(layout.ignored_files):
        _note(f"skipped {issue}")
    if not loaded.dumps:
        _fail("no usable dump among " + ", ".join(str(path) for _, path in files[:3]))
    ranks: Optional[list[int]] = None
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
        by_rank: dict[int, Union[RankDump, LoadIssue]] = {d.rank: d for d in loaded.dumps}
        # The files' own issues come last among the errors (archive members refused by name first).
        failed = loaded.errors[len(loaded.errors) - len(loaded.failed_ranks):]
        by_rank.update(zip(loaded.failed_ranks, failed))
        for rank, _ in files:
            _emit_block(rank_block_lines(rank, by_rank[rank], opts.filters, _last(opts.last), stacks))
        _finish(EXIT_HEALTHY, opts.verbose, started, load_seconds)
    if opts.last is not None:
        _note("note: --last only applies to the per-rank blocks (--per-rank); the table shows every entry")
    _emit_lines(lines)
    _finish(EXIT_HEALTHY, opts.verbose, started, load_seconds)


def _last(last: Optional[int]) -> int:
    return DEFAULT_LAST if last is None else last


def _print_rank_blocks(files: list[RankFile], opts: RawOptions, started: float) -> NoReturn:
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
    _finish(EXIT_HEALTHY, opts.verbose, started, time.monotonic() - started)


def _note_ranks_without_files(files: list[RankFile], rank_ranges: Optional[tuple[range, ...]]) -> None:
    """Ranks below the highest one found (and selected) that have no dump file."""
    present = {rank for rank, _ in files}
    top = max(present)
    spans = rank_ranges if rank_ranges is not None else (range(0, top + 1),)
    absent = sorted({rank for span in spans for rank in range(span.start, min(span.stop, top + 1)) if rank not in present})
    if absent:
        _note(f"note: no dump file for {'rank' if len(absent) == 1 else 'ranks'} {fold_ranks(absent)}")
