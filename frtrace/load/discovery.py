"""Find the dump files: one per rank, of one incident.

Takes directories, files, archives or URLs; returns a `Discovery`: `(rank, path)` of
each rank's dump file (the rank from the file name), the files skipped and why, the
naming family, and notes (several generations found, which one is read). Nothing is
decoded here beyond the first bytes that tell a dump from another file.
"""


import os
import re
import stat
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional, Sequence

from frtrace.errors import InputError  # raised here, caught by the API's callers
from frtrace.load.generations import (
    DumpFile,
    SameRankTwice,
    choose_generation,
    describe,
    plausible_time,
    require_one_file_per_rank,
)
from frtrace.load.safe_decode import _GZIP_RATIO_FLOOR as INFLATION_FLOOR
from frtrace.load.sniff import OWN_OUTPUTS, FileKind, classify_file, classify_head
from frtrace.load.sources import (
    DumpPath,
    Input,
    Problem,
    RefusedMember,
    Source,
    SourceError,
    as_input,
    expand_input,
    needs_expanding,
)
from frtrace.model import LoadIssue
from frtrace.util import plural, shortened

DEFAULT_MAX_FILE_BYTES = 2 * 1024**3
# Suffixes a dump file may carry after its rank number, stripped right to left.
DUMP_SUFFIXES = (".gz", ".pkl", ".pickle", ".json", ".bin", ".dump", ".trace")
# Words that mark a naming family as Flight Recorder dumps rather than, say, core files.
DUMP_NAME_HINTS = ("rank", "trace", "dump", "fr_", "nccl", "comm")
_TRAILING_RANK = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")


# How the reason for leaving out a dump of another incident begins (see _one_generation).
OTHER_GENERATION = "another generation of dumps"


# --------------------------------------------------------------------------- discovery


class _Candidate:
    __slots__ = ("path", "prefix", "rank", "tag")

    def __init__(self, path: DumpPath, prefix: str, rank: int, tag: str = "") -> None:
        # tag: what marks another generation of the same rank (`.1` in `rank_3.1`)
        self.path, self.prefix, self.rank, self.tag = path, prefix, rank, tag


def _strip_suffixes(name: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for suffix in DUMP_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name


def parse_rank_from_name(name: str, prefix: Optional[str] = None) -> Optional[tuple[str, int]]:
    """`("nccl_trace_rank_node02_", 5)` for `nccl_trace_rank_node02_5.pkl`, or None."""
    if prefix is not None and not name.startswith(prefix):
        return None
    match = _TRAILING_RANK.match(_strip_suffixes(name))
    if not match or (prefix is not None and len(match["prefix"]) < len(prefix)):
        return None
    return match["prefix"], int(match["rank"])


def _naming_family(prefix: str) -> str:
    # Host-qualified names (`node02_`, `host0.pci3_rank_`) differ per host only in digits.
    return re.sub(r"\d+", "#", prefix)


def _walk_files(root: Path) -> Iterable[Path]:
    # os.walk does not follow directory symlinks, so symlink loops cannot trap it.
    for dirpath, dirnames, filenames in os.walk(root, onerror=None):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if not filename.startswith("."):
                yield Path(dirpath) / filename


def _expand_inputs(inputs: Sequence[Input], issues: list[LoadIssue], refused: Optional[list[LoadIssue]] = None,
                   max_bytes: int = DEFAULT_MAX_FILE_BYTES, prefix: Optional[str] = None,
                   notes: Optional[list[str]] = None) -> list[DumpPath]:
    files: list[DumpPath] = []
    # A caller of the library may name a local path as text: as the command line does, only
    # URLs stay text (see sources.as_input), so text is never taken for a local Path below.
    inputs = [as_input(item) for item in inputs]
    expanded = [item for item in inputs if needs_expanding(item)]
    # Compressed tarballs inflate as they are listed: together, within one floor.
    floor = INFLATION_FLOOR // max(1, len(expanded))
    for item in inputs:
        # A URL (all text is, now) or an archive: its objects or members (load/sources.py).
        if isinstance(item, str) or needs_expanding(item):
            wanted = lambda name: parse_rank_from_name(name, prefix) is not None  # noqa: E731
            problems: list[Problem] = []
            try:
                files.extend(expand_input(item, max_bytes, wanted, problems, notes, floor))
            except SourceError as exc:
                raise InputError(str(exc)) from None
            if refused is not None:
                refused.extend(LoadIssue(str(where), problem) for where, problem in problems)
        elif item.is_dir():
            files.extend(_walk_files(item))
        elif item.is_file():
            files.append(item)
        elif item.exists():
            issues.append(LoadIssue(str(item), "not a regular file or directory"))
        else:
            raise InputError(f"{item}: no such file or directory")
    return _each_file_once(files, notes)


def _each_file_once(files: list[DumpPath], notes: Optional[list[str]]) -> list[DumpPath]:
    """`files` with each file once: one reached through two inputs (`frtrace d d/rank_3`,
    an archive given twice) or through a link next to it is the same file, not two dumps
    of its rank. The last spelling is kept; one note says how many were reached twice."""
    kept: dict[str, DumpPath] = {}
    twice = []
    for path in files:
        key = str(path) if isinstance(path, Source) else os.path.realpath(path)
        if key in kept:
            twice.append(path)
            del kept[key]
        kept[key] = path
    if twice and notes is not None:
        shown = ", ".join(shortened(str(path), 200) for path in twice[:3]) + (" ..." if len(twice) > 3 else "")
        notes.append(f"{plural(len(twice), 'file')} reached twice (through two inputs, or a link): each read once ({shown})")
    return list(kept.values())


# How torch's own default and documented dump names end, before the rank.
TORCH_DUMP_PREFIXES = ("rank_", "_dump_", "trace_")
# A family is confirmed as dumps by the content of one of its first few files: enough to
# tell man pages (`pg_waldump.1.gz`) from dumps, cheap in a directory of 16,384 dumps.
SNIFF_PER_FAMILY = 8
# Name endings frtrace's own outputs can have that also pass for dump suffixes.
_OUTPUT_LIKE_SUFFIXES = (".pkl", ".pickle", ".json", ".gz")
_GENERATION_TAG = re.compile(r"^(?P<prefix>.*\D)(?P<rank>\d+)(?P<tag>\.)$")


def _family_score(counts: Counter[str]) -> Callable[[str], tuple[bool, int, str]]:
    def score(family: str) -> tuple[bool, int, str]:
        hinted = any(hint in family.lower() for hint in DUMP_NAME_HINTS)
        return (hinted, counts[family], family)

    return score


def _pick_family(candidates: list[_Candidate]) -> Optional[str]:
    """The naming family of the dumps: the best-scoring one whose content says dump;
    failing that (every file broken), the best whose name says dump. None for neither."""
    by_family: dict[str, list[_Candidate]] = {}
    for cand in candidates:
        by_family.setdefault(_naming_family(cand.prefix), []).append(cand)
    ranked = sorted(by_family, key=_family_score(Counter({f: len(c) for f, c in by_family.items()})), reverse=True)
    kinds = {family: {_classify(c.path) for c in by_family[family][:SNIFF_PER_FAMILY]} for family in ranked}
    for family in ranked:
        if FileKind.DUMP in kinds[family]:
            return family
    # Every dump broken (the user wants to hear which, and why): named the way torch names
    # dumps, or like dumps and pickle, JSON or empty; not binaries or man pages whose
    # names merely hold a word (`llvm-objdump-14`, `pg_waldump.1.gz`).
    for family in ranked:
        hinted = any(hint in family.lower() for hint in DUMP_NAME_HINTS)
        if family.lower().endswith(TORCH_DUMP_PREFIXES) or (
                hinted and not family.endswith(".") and kinds[family] & {FileKind.DATA, FileKind.EMPTY}):
            return family
    return None


def _is_own_output(cand: _Candidate, skipped: list[LoadIssue]) -> bool:
    """frtrace's Database, SQLite or timeline file left among the dumps (by its content)."""
    if not cand.path.name.lower().endswith(_OUTPUT_LIKE_SUFFIXES):
        return False
    kind = _classify(cand.path)
    if kind in OWN_OUTPUTS:
        skipped.append(LoadIssue(str(cand.path), f"{kind.value} (an output of frtrace), not a dump"))
        return True
    return False


def _with_generation_tags(candidates: list[_Candidate]) -> list[_Candidate]:
    """`rank_3.1` next to `rank_3`: rank 3 of another generation, not rank 1 of `rank_3.`.
    Only when the plain family exists, so `job3.0, job3.1, ...` keep their ranks."""
    plain = {_naming_family(c.prefix) for c in candidates}
    tagged = []
    for cand in candidates:
        match = _GENERATION_TAG.match(cand.prefix)
        if match and _naming_family(match["prefix"]) in plain:
            cand = _Candidate(cand.path, match["prefix"], int(match["rank"]), f".{cand.rank}")
        tagged.append(cand)
    return tagged


def _classify(path: DumpPath) -> FileKind:
    """`classify_file` for a local path or a Source (an object in a store, an archive member)."""
    if isinstance(path, Source):
        try:
            return classify_head(path.head())
        except (OSError, ValueError, SourceError):
            return FileKind.OTHER
    return classify_file(path)


# A dump file found for a rank: a local path, or an object in a store or an archive member.
RankFile = tuple[int, DumpPath]


class Discovery(NamedTuple):
    files: list[RankFile]  # sorted by rank
    skipped: list[LoadIssue]  # for each file not taken
    prefix: str  # the naming family, digits shown as N
    notes: list[str]  # one line each for the user: several generations found, which one is read
    # archive members refused by name or type, archives cut short: LoadIssue each (errors, not skips)
    refused: tuple[LoadIssue, ...] = ()


def discover_dump_files(inputs: Sequence[Input], prefix: Optional[str] = None, all_generations: bool = False,
                        max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Discovery:
    """The dump files under `inputs`, one per rank, of the newest complete generation
    (see load/generations.py) unless `all_generations`.

    Without `prefix`, the naming family most files share (digits inside host names are
    treated alike) and whose content is a dump wins; other files are skipped with a
    reason, and so are frtrace's own outputs.
    """
    skipped: list[LoadIssue] = []
    refused: list[LoadIssue] = []
    listed: list[str] = []  # notes from listing archives and prefixes (names listed twice)
    candidates = []
    for path in _expand_inputs(inputs, skipped, refused, max_bytes, prefix, listed):
        if isinstance(path, RefusedMember) and not path.candidate:
            refused.append(LoadIssue(str(path), path.reason))  # a link, a `..` name: never a rank's dump
            continue
        parsed = parse_rank_from_name(path.name, prefix)
        if parsed is None:
            reason = "no rank number in the file name" if prefix is None else f"name does not start with {prefix!r}"
            skipped.append(LoadIssue(str(path), reason))
        else:
            candidates.append(_Candidate(path, parsed[0], parsed[1]))
    candidates = _with_generation_tags([c for c in candidates if not _is_own_output(c, skipped)])
    family = _naming_family(prefix) if prefix is not None else _pick_family(candidates) if candidates else None
    if family is None:
        skipped.extend(LoadIssue(str(c.path), "not a Flight Recorder dump") for c in candidates)
        return Discovery([], skipped, prefix or "", listed, tuple(refused))
    chosen = []
    for cand in candidates:
        if prefix is None and _naming_family(cand.prefix) != family:
            skipped.append(LoadIssue(str(cand.path), f"name does not follow the dump naming {family.replace('#', 'N')}<rank>"))
        else:
            chosen.append(cand)
    timed, impossible = _times_known(chosen, time.time())
    files, notes = _one_generation(timed, skipped, all_generations)
    if 0 < impossible < len(chosen) and not all_generations:  # all alike (a tar made with --mtime=@0): nothing to say
        listed.append(f"{plural(impossible, 'dump file')} with a time no file can have (not a number, before 1980 or "
                      "in the future): taken as written with the newest")
    return Discovery(sorted(files), skipped, family.replace("#", "N"), listed + notes, tuple(refused))


def _mtime(path: DumpPath) -> Optional[float]:
    if isinstance(path, Source):
        return path.mtime
    try:
        info = os.stat(path)
    except OSError:
        return None  # reading it says why
    # A device or FIFO named like a dump carries no dump's time (and is refused when read).
    return info.st_mtime if stat.S_ISREG(info.st_mode) else None


def _times_known(candidates: list[_Candidate], now: float) -> tuple[list[DumpFile], int]:
    """`(files, how many had an impossible time)`: files whose time says nothing (none, or
    one no file can have: see generations.plausible_time) go with the newest, never a
    generation of their own."""
    mtimes = [_mtime(c.path) for c in candidates]
    times = [plausible_time(mtime, now) for mtime in mtimes]
    impossible = sum(1 for mtime, t in zip(mtimes, times) if t is None and mtime is not None)
    newest = max((t for t in times if t is not None), default=0.0)
    return [DumpFile(c.rank, c.path, c.tag, newest if t is None else t) for c, t in zip(candidates, times)], impossible


def _one_generation(files: list[DumpFile], skipped: list[LoadIssue],
                    all_generations: bool) -> tuple[list[RankFile], list[str]]:
    """`([(rank, path)], notes)` of the generation to analyse; the others join `skipped`."""
    try:
        if all_generations:
            require_one_file_per_rank(files)
            return [(f.rank, f.path) for f in files], []
        choice = choose_generation(files)
    except SameRankTwice as exc:
        raise InputError(f"{exc} (pass one directory, or choose with --prefix)") from None
    if choice is None:
        return [], []
    newest = choice.chosen.newest
    for f in choice.left_out:
        minutes = abs(newest - f.mtime) / 60
        skipped.append(LoadIssue(str(f.path), f"{OTHER_GENERATION} (written {minutes:.0f} min "
                                 f"{'before' if f.mtime <= newest else 'after'} the analysed ones): not mixed with them"))
    notes = [describe(choice)] if choice.others else []
    return [(f.rank, f.path) for f in choice.chosen.files], notes


def find_dump_files(inputs: Sequence[Path], prefix: Optional[str] = None) -> tuple[list[RankFile], list[LoadIssue], str]:
    """`(files, skipped, prefix_used)` of `discover_dump_files`: files is a sorted list of (rank, path)."""
    found = discover_dump_files(inputs, prefix)
    return found.files, found.skipped, found.prefix
