"""Run the stages in order: the one entry point the CLI and other tools call.

Takes input paths and options; returns an `Analysis` holding every stage's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .builder import Layout, build_layout
from .loader import DEFAULT_MAX_FILE_BYTES, InputError, load_dumps
from .matcher import MatchResult, deal, match
from .model import LoadResult, PgConfig, RankDump


@dataclass(slots=True)
class Analysis:
    load: LoadResult
    layout: Layout
    matches: MatchResult


def analyze(
    inputs: Sequence,
    *,
    prefix: Optional[str] = None,
    world_size: Optional[int] = None,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: Optional[Callable[[int, int], None]] = None,
    ft_group_world_size: Optional[int] = None,
    all_generations: bool = False,
) -> Analysis:
    """Load, build and match. Raises InputError when nothing usable was found.

    `ft_group_world_size` handles torchft dumps, whose pg_config ranks are local to
    each replica group of that many ranks. `all_generations` reads every generation of
    dumps found together (see loader.discover_dump_files).
    """
    # Each dump is dealt into its groups as it arrives, while the workers decode the next.
    dealt: dict = {}
    loaded = load_dumps(inputs, prefix, workers=workers, max_bytes=max_bytes, progress=progress,
                        on_dump=lambda dump: dealt.__setitem__(id(dump), deal(dump)), all_generations=all_generations)
    if ft_group_world_size:
        loaded.dumps = [_globalise_ft_ranks(d, ft_group_world_size) for d in loaded.dumps]
    if not loaded.dumps:
        where = ", ".join(str(p) for p in inputs)
        if loaded.errors:
            raise InputError(f"no usable dump in {where}: " + "; ".join(str(e) for e in loaded.errors[:3]))
        raise InputError(f"no Flight Recorder dump files found in {where}")
    layout = build_layout(loaded.dumps, loaded.failed_ranks, world_size)
    return Analysis(loaded, layout, match(loaded.dumps, layout, dealt))


def _globalise_ft_ranks(dump: RankDump, group_world_size: int) -> RankDump:
    base = (dump.rank // group_world_size) * group_world_size
    dump.pg_config = tuple(
        PgConfig(c.name, c.desc, tuple(base + r for r in c.ranks) if c.ranks else c.ranks) for c in dump.pg_config
    )
    return dump
