"""Tell apart several incidents whose dumps share one directory, and pick one.

A directory kept across restarts collects dumps of more than one hang: the same rank
twice (`rank_3` and `rank_3.1`, or in two subdirectories), or, when a later incident
overwrote some files, files whose modification times lie minutes apart. Mixing them
would compare one incident's rank 0 with another's rank 1. `choose_generation` splits
the files into generations and picks the newest complete one (ranks 0..N-1 all there),
else the newest; the caller says which, and lists the rest as left out.

One file's clock cannot decide for the others: a generation holding nearly every rank
found is never passed over for one of a few files (`touch` one dump into the future, or
into the past), and a time no file can have (-1e300, inf, NaN, before 1980, later than
now) is no time at all (`plausible_time`): such a file goes with the newest.

Pure: takes file facts (rank, path, name tag, mtime) and the time now, never reads or prints.
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Iterable, NamedTuple, Optional, TypeVar

from frtrace.load.sources import DumpPath
from frtrace.util import fold_ranks, plural

# Ranks of one incident dump within seconds of each other (all time out together, or are
# told to dump by the first that did); an incident minutes later is another hang.
GAP_SECONDS = 300.0
# A generation holding this share of every rank found is the job: another generation with
# at most FEW_FILES of its files (one `touch`ed file, a stray rerun of a rank) never wins over it.
NEARLY_EVERY_RANK = 0.9
FEW_FILES = 0.5
# Times up to this (1980-01-01, the earliest a zip can say, and what one says without a
# time) are placeholders, not times.
EARLIEST_TIME = 315_532_800.0
_Key = TypeVar("_Key", bound=Hashable)


def plausible_time(mtime: Optional[float], now: float) -> Optional[float]:
    """`mtime` when a file written by a job can have it; None for a number that is not a
    time (infinite, NaN, 1980 or before) or one later than `now` by more than GAP_SECONDS
    (clocks of hosts that share a file system differ by seconds, not minutes)."""
    if mtime is None or not math.isfinite(mtime) or mtime <= EARLIEST_TIME or mtime > now + GAP_SECONDS:
        return None
    return mtime


class DumpFile(NamedTuple):
    rank: int
    path: DumpPath
    tag: str  # what follows the rank in the name: "" for rank_3, ".1" for rank_3.1
    mtime: float


class Generation(NamedTuple):
    files: tuple[DumpFile, ...]  # sorted by rank

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(f.rank for f in self.files)

    @property
    def newest(self) -> float:
        return max(f.mtime for f in self.files)

    @property
    def complete(self) -> bool:
        """Every rank from 0 to its highest is there."""
        return len(set(self.ranks)) == max(self.ranks) + 1


class GenerationChoice(NamedTuple):
    chosen: Generation
    others: tuple[Generation, ...]  # newest first
    why: str = "newest"  # which one it is: newest, newest complete, or the one with nearly every rank

    @property
    def left_out(self) -> tuple[DumpFile, ...]:
        return tuple(f for generation in self.others for f in generation.files)


class SameRankTwice(ValueError):
    """Two files of one rank that nothing tells apart (same directory, tag and time)."""

    def __init__(self, first: DumpFile, second: DumpFile) -> None:
        super().__init__(f"rank {first.rank} has two dump files: {first.path} and {second.path}")
        self.first, self.second = first, second


def _by_key(files: Iterable[DumpFile], key: Callable[[DumpFile], _Key]) -> dict[_Key, list[DumpFile]]:
    groups: dict[_Key, list[DumpFile]] = {}
    for f in files:
        groups.setdefault(key(f), []).append(f)
    return groups


def _split_by_time(files: list[DumpFile], gap: float) -> list[list[DumpFile]]:
    """Runs of files whose modification times follow each other within `gap` seconds."""
    ordered = sorted(files, key=lambda f: (f.mtime, str(f.path)))
    runs = [[ordered[0]]]
    for f in ordered[1:]:
        if f.mtime - runs[-1][-1].mtime > gap:
            runs.append([])
        runs[-1].append(f)
    return runs


def _merge_disjoint(groups: list[list[DumpFile]], gap: float) -> list[list[DumpFile]]:
    """Per-host subdirectories of one job hold disjoint ranks, dumped at about the same
    time: one generation. Directories that repeat a rank, or dumped apart, stay apart."""
    merged: list[list[DumpFile]] = []
    for group in sorted(groups, key=lambda g: (-max(f.mtime for f in g), str(g[0].path))):
        ranks = {f.rank for f in group}
        for other in merged:
            close = abs(max(f.mtime for f in other) - max(f.mtime for f in group)) <= gap
            if close and not ranks & {f.rank for f in other}:
                other.extend(group)
                break
        else:
            merged.append(list(group))
    return merged


def require_one_file_per_rank(files: Iterable[DumpFile]) -> None:
    """SameRankTwice unless every rank has one file."""
    seen: dict[int, DumpFile] = {}
    for f in sorted(files, key=lambda f: str(f.path)):
        if f.rank in seen:
            raise SameRankTwice(seen[f.rank], f)
        seen[f.rank] = f


def split_generations(files: Iterable[DumpFile], gap: float = GAP_SECONDS) -> list[Generation]:
    """The generations among `files`, newest first. SameRankTwice when one generation
    would still hold a rank twice (say `rank_0` and `rank_0.json` side by side)."""
    generations = []
    for tagged in _by_key(files, lambda f: f.tag).values():
        by_directory = [run for group in _by_key(tagged, lambda f: f.path.parent).values()
                        for run in _split_by_time(group, gap)]
        for group in _merge_disjoint(by_directory, gap):
            require_one_file_per_rank(group)
            generations.append(Generation(tuple(sorted(group, key=lambda f: f.rank))))
    return sorted(generations, key=lambda g: (-g.newest, str(g.files[0].path)))


def choose_generation(files: Iterable[DumpFile], gap: float = GAP_SECONDS) -> Optional[GenerationChoice]:
    """The newest complete generation (else the newest) and the others; None without files.
    SameRankTwice when another generation holds one of its ranks and was written at about
    the same time: then nothing says which incident is the one to read."""
    generations = split_generations(files, gap)
    if not generations:
        return None
    chosen = next((g for g in generations if g.complete), generations[0])
    why = "newest" if chosen is generations[0] else "newest complete"
    largest = max(generations, key=lambda g: (len(g.files), g.newest))
    every_rank = {rank for g in generations for rank in g.ranks}
    if (largest is not chosen and len(largest.files) >= NEARLY_EVERY_RANK * len(every_rank)
            and len(chosen.files) <= FEW_FILES * len(largest.files)):
        chosen, why = largest, f"one holding nearly every rank ({len(largest.files)} of {len(every_rank)})"
    others = tuple(g for g in generations if g is not chosen)
    for other in others:
        shared = set(chosen.ranks) & set(other.ranks)
        if shared and abs(chosen.newest - other.newest) <= gap:
            rank = min(shared)
            raise SameRankTwice(*(next(f for f in g.files if f.rank == rank) for g in (chosen, other)))
    return GenerationChoice(chosen, others, why)


def describe(choice: GenerationChoice) -> str:
    """One line for the user: what was found, what is analysed, what is left out and why."""
    chosen = choice.chosen
    where = sorted({str(f.path.parent) for f in chosen.files})
    tag = f" named with {chosen.files[0].tag!r}" if chosen.files[0].tag else ""
    newer = sum(1 for f in choice.left_out if f.mtime > chosen.newest)
    kinds = [plural(len(choice.left_out) - newer, "older or incomplete file")] if len(choice.left_out) > newer else []
    kinds += [plural(newer, "newer file")] if newer else []
    return (f"found {plural(len(choice.others) + 1, 'generation')} of dumps (several incidents); analysing the "
            f"{choice.why}: ranks {fold_ranks(chosen.ranks)} in {', '.join(where)}{tag}; left out "
            f"{' and '.join(kinds)} of another incident (-v lists them)")
