"""Read the dump files safely, in parallel, and normalise them.

Takes directories and/or files (found by `discovery`); returns a `LoadResult` with one
`RankDump` per rank (sorted by rank), the unrelated files that were skipped and the dump
files that could not be used. Files are read with size caps and decoded by a restricted
unpickler (`safe_decode`) in worker processes, a file that could crash its decoder in a
child of its own; each is normalised there (`normalise`). Nothing here prints: the caller
decides what to say.
"""

from __future__ import annotations

import faulthandler
import functools
import io
import multiprocessing
import operator
import os
import signal
import stat
import threading
from array import array
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Iterator,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    TypeVar,
    Union,
    cast,
    overload,
)

from frtrace.errors import InputError
from frtrace.load.discovery import (
    DEFAULT_MAX_FILE_BYTES,
    Discovery,
    RankFile,
    discover_dump_files,
    find_dump_files,
    parse_rank_from_name,
)
from frtrace.load.forked import Forked, OwnResultUnpickler
from frtrace.load.normalise import (
    DEFAULT_MAX_ENTRIES,
    BatchMemo,
    normalise_dump,
    normalised_without_entries,
    parse_profiling_name,
    set_entries,
)
from frtrace.load.safe_decode import _GZIP_RATIO_FLOOR, DecodeError, MayNestTooDeeply, decode_dump
from frtrace.load.sources import DumpPath, Input, Source, SourceError, as_input
from frtrace.model import LoadIssue
from frtrace.table.by_group import GroupParts, deal_by_group
from frtrace.table.entry_columns import SharedValues
from frtrace.table.rank_dump import LoadResult, RankDump
from frtrace.util import cyclic_gc_paused

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = ["DEFAULT_MAX_ENTRIES", "DEFAULT_MAX_FILE_BYTES", "Discovery", "InputError", "RemoteLoad", "discover_dump_files",
           "dispatch_load",
           "find_dump_files", "iter_dump_files", "load_dump_files", "load_dumps", "load_one", "normalise_dump",
           "parse_profiling_name", "parse_rank_from_name", "read_dump_file", "select_files"]


# What loading one file gives: its dump, or why there is none.
LoadOutcome = Union[RankDump, LoadIssue]
# One load job: (rank, path: a local path as text or a Source, max bytes, drop it from the
# page cache, its share of the inflation floor): load_one's first arguments.
Job = tuple[int, Union[str, Source], int, bool, int]
# Called with (files done, files in all).
Progress = Callable[[int, int], None]
_Mapped = TypeVar("_Mapped")

# --------------------------------------------------------------------------- loading


def read_dump_file(path: str, max_bytes: int, drop_from_cache: bool = False) -> bytes:
    """The bytes of one regular file of at most `max_bytes`; OSError or ValueError otherwise.

    Opened without blocking and checked on the open descriptor, so a FIFO or a device
    named like a dump (or a symlink to one) is refused instead of read forever.
    `drop_from_cache` asks the kernel to forget the file's pages once read (see
    `_inputs_crowd_memory`).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb", closefd=True) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"file is {info.st_size:,} bytes, over the {max_bytes:,}-byte limit (raise --max-file-size)")
        data = handle.read(info.st_size + 1)
        if len(data) > info.st_size:  # still being written: read on, in bounded steps
            parts, size = [data], len(data)
            while size <= max_bytes and (chunk := handle.read(1 << 24)):
                parts.append(chunk)
                size += len(chunk)
            data = b"".join(parts)
        if drop_from_cache and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:  # only advice: a file system may not take it
                pass
    if len(data) > max_bytes:
        raise ValueError(f"file is over the {max_bytes:,}-byte limit (raise --max-file-size)")
    return data


# Dumps larger than this share of the machine's memory are dropped from the page cache
# once read (see _inputs_crowd_memory).
CACHE_SHARE = 0.25


def _inputs_crowd_memory(paths: Sequence[DumpPath]) -> bool:
    """Whether the dump files are large next to this machine's memory. Then the page cache
    holding them would crowd out the memory the analysis needs (about 1.5 times their
    size): past free memory, every page the main process touches first makes the kernel
    evict a cached page, which measured 4x slower per page here (14 us instead of 3.4;
    35 s of a 16,384-rank run). A second run reads them from disk again instead."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    total = 0
    for path in paths:
        if isinstance(path, Source):
            continue  # not in this machine's page cache
        try:
            total += os.stat(path).st_size
        except OSError:
            continue  # reported when it is read
    return total > CACHE_SHARE * memory


def _read_source(path: Union[str, Source], max_bytes: int, drop_from_cache: bool = False,
                 floor: int = _GZIP_RATIO_FLOOR) -> Union[bytes, LoadIssue]:
    """The bytes of a dump file (a local path, or a Source: an object in a store, an
    archive member, inflated within `floor`), or a LoadIssue saying why they cannot be read."""
    try:
        if isinstance(path, Source):
            return path.read(max_bytes, floor)
        return read_dump_file(path, max_bytes, drop_from_cache)
    except OSError as exc:
        return LoadIssue(str(path), f"cannot read ({exc.strerror or exc})")
    except (ValueError, SourceError) as exc:
        return LoadIssue(str(path), str(exc))


def _decoding_is_capped() -> bool:
    """Whether this process may lower its address-space limit while it decodes (see
    safe_decode._address_space_cap): not while other threads run (a dask worker, or
    fsspec's I/O thread). There, pickles are decoded in a forked single-threaded child
    instead, so that the same limits hold, and the same results come out, everywhere."""
    return threading.active_count() <= 1


def load_one(rank: int, path: Union[str, Source], max_bytes: int = DEFAULT_MAX_FILE_BYTES, drop_from_cache: bool = False,
             floor: int = _GZIP_RATIO_FLOOR, *, packed: bool = False, shared: Optional[SharedValues] = None,
             memo: Optional[BatchMemo] = None, data: Optional[bytes] = None) -> LoadOutcome:
    """Read and normalise one file: a RankDump, or a LoadIssue saying why not.

    `path` is a local path or a Source (load/sources.py); `data` its bytes when read already.
    `floor` is this file's share of the run's inflation floor (see safe_decode.inflation_allowed).
    `packed` (in a worker process) leaves the entry table's values unshared: `_received`
    shares them in the main process; `shared` holds the values the entries of all ranks share, and
    `memo` what other files of the same batch taught (see BatchMemo)."""
    if data is None:
        read = _read_source(path, max_bytes, drop_from_cache, floor)
        if isinstance(read, LoadIssue):
            return read
        data = read
    # What a gzip'd dump inflates against: the bytes it took in the input (a zip member's
    # compressed bytes, not the inflated ones it was read as).
    limits = _Limits(max_bytes, floor, (path.stored or None) if isinstance(path, Source) else None)
    where = str(path)
    if (data[:1] == b"\x80" or data[:2] == b"\x1f\x8b") and not _decoding_is_capped():
        result = _loaded_in_own_process(data, rank, where, limits)
        return _received(result, shared or SharedValues())[0] if isinstance(result, RankDump) and not packed else result
    result = _loaded(data, rank, where, limits, packed=packed, shared=shared, memo=memo)
    if result is _NEEDS_OWN_PROCESS:
        result = _loaded_in_own_process(data, rank, where, limits)
        if isinstance(result, RankDump) and not packed:
            result = _received(result, shared or SharedValues())[0]
    return result


_NEEDS_OWN_PROCESS = LoadIssue("", "may crash the process that decodes it")


class _Limits(NamedTuple):
    """What one file may take: its bytes (`--max-file-size`, also inflated), its share of the
    inflation floor, and the bytes of the input it came from (None: its own length)."""

    max_bytes: int
    floor: int
    stored: Optional[int]


def _loaded(data: bytes, rank: int, path: str, limits: _Limits, *, packed: bool = False,
            shared: Optional[SharedValues] = None, memo: Optional[BatchMemo] = None, isolated: bool = False) -> LoadOutcome:
    """`load_one` once the bytes are read; _NEEDS_OWN_PROCESS when decoding them could
    crash this process (and `isolated` does not say it may)."""
    try:
        # A decoded dump is a tree of some 100,000 fresh dicts and lists: the collector
        # would scan it several times over while it is built (10-30% of the load).
        with cyclic_gc_paused():
            raw, encoding, pickle_bytes = decode_dump(data, limits.max_bytes, isolated=isolated, floor=limits.floor,
                                                      stored=limits.stored)
            del data
            dump, columns = normalised_without_entries(raw, rank, path, encoding, memo, pickle_bytes=pickle_bytes)
            del raw
            # In a worker (`packed`), the table's values are shared with other ranks' later,
            # in the main process (see _received).
            set_entries(dump, columns, None if packed else shared)
            return dump
    except MayNestTooDeeply:
        return _NEEDS_OWN_PROCESS
    except DecodeError as exc:
        return LoadIssue(path, str(exc))
    except (RecursionError, MemoryError) as exc:
        return LoadIssue(path, f"dump too deep or too large ({type(exc).__name__})")


def _loaded_in_own_process(data: bytes, rank: int, path: str, limits: _Limits) -> LoadOutcome:
    """`_loaded` in a child process, packed for transfer: a pickle that crashes the C
    unpickler (see safe_decode.SAFE_TUPLE_OPCODES) then costs this one file. Forked where
    the platform can, so the child inherits `data` instead of receiving a copy."""
    result, exitcode = _in_child(_load_isolated, data, rank, path, limits)
    if result is None:
        return LoadIssue(path, f"pickle nested too deeply or otherwise hostile: decoding it crashed "
                               f"a separate process ({_exit_reason(exitcode)})")
    return result


def _load_isolated(data: bytes, rank: int, path: str, limits: _Limits) -> LoadOutcome:
    (result,) = _for_transfer([_loaded(data, rank, path, limits, packed=True, memo=BatchMemo(), isolated=True)])
    return result


def _in_child(function: Callable[..., _Mapped], *args: object) -> tuple[Optional[_Mapped], Optional[int]]:
    """`(function(*args), None)` computed in a child process, or `(None, exit code)` when
    the child died. Forked where the platform can (with os.fork, so that daemonic processes
    such as dask's and multiprocessing's workers may do it too)."""
    if not hasattr(os, "fork"):
        return _in_spawned_child(function, *args)
    return Forked.start(function, *args).collect()


def _in_spawned_child(function: Callable[..., _Mapped], *args: object) -> tuple[Optional[_Mapped], Optional[int]]:
    context = multiprocessing.get_context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_compute_and_send, args=(function, args, sender), daemon=True)
    child.start()
    sender.close()
    try:
        result: Optional[_Mapped] = receiver.recv()  # before join: a large result would fill the pipe
    except (EOFError, OSError):
        result = None
    finally:
        receiver.close()
    child.join()
    return (result, None) if result is not None else (None, child.exitcode)


def _compute_and_send(function: Callable[..., object], args: tuple[object, ...], sender: Connection) -> None:
    faulthandler.disable()
    sender.send(function(*args))
    sender.close()


def _exit_reason(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


# What was read of each file of a batch: its bytes, or why they could not be read.
ReadBatch = list[Union[bytes, LoadIssue]]


def _load_batch_for_transfer(jobs: list[Job], deal: bool = False) -> list[Sent]:
    """`load_one` for a few files in a worker process. Entries travel to the parent as
    EntryTables (arrays and small tables), which pickle at memory speed; an Entry per
    entry would cost a pickle round trip each. With `deal`, each dump travels as a
    `DealtDump`, its entries dealt by group here (see table/by_group.py), so that the
    process that receives thousands of dumps only puts the parts together.

    In a process running other threads, the files are read here and decoded in a
    single-threaded child forked for the batch (see _decoding_is_capped); a dask worker
    keeps such children instead (cluster_worker.py), with the same pieces: `read_batch`,
    `decode_batch` in the child, `crashed_batch` when it died."""
    if not _decoding_is_capped():
        read = read_batch(jobs)
        results, exitcode = _in_child(decode_batch, jobs, read, deal)
        return results if results is not None else crashed_batch(jobs, read, exitcode)
    memo = BatchMemo()
    return _dealt(_for_transfer([load_one(*job, packed=True, memo=memo) for job in jobs]), deal)


def read_batch(jobs: list[Job]) -> ReadBatch:
    """The bytes of each job's file, or why they cannot be read (see _read_source)."""
    return [_read_source(*job[1:]) for job in jobs]


def decode_batch(jobs: list[Job], read: ReadBatch, deal: bool = False) -> list[Sent]:
    """What `_load_batch_for_transfer` sends for files read already (`read_batch`): run in
    a single-threaded child process, where decoding is capped."""
    memo = BatchMemo()
    return _dealt(_for_transfer([data if isinstance(data, LoadIssue) else load_one(*job, packed=True, memo=memo, data=data)
                                 for job, data in zip(jobs, read)]), deal)


def crashed_batch(jobs: list[Job], read: ReadBatch, exitcode: Optional[int]) -> list[Sent]:
    """What is sent for a batch whose decoding killed its child process (short of a bug or
    the OOM killer, it cannot happen): its files named, each with the reason."""
    reason = f"decoding crashed a separate process ({_exit_reason(exitcode)})"
    return [data if isinstance(data, LoadIssue) else LoadIssue(str(job[1]), reason) for job, data in zip(jobs, read)]


def _dealt(results: list[LoadOutcome], deal: bool) -> list[Sent]:
    if not deal:
        return list(results)
    return [DealtDump(result, deal_by_group(result.entries)) if isinstance(result, RankDump) else result
            for result in results]


class DealtDump(NamedTuple):
    """A dump as a worker sends it with its entries dealt by group (`deal`, above)."""

    dump: RankDump
    parts: GroupParts


# Called in the loading process with each dump as it arrives, and its entries dealt by
# group when a worker dealt them (None: not dealt; the dump's entries are all there is).
OnDump = Callable[[RankDump, Optional[GroupParts]], None]
# What a worker sends back for one job: its outcome, or its dump with the entries dealt.
Sent = Union[RankDump, LoadIssue, DealtDump]


class Runner(Protocol):
    """Runs load jobs instead of the local process pool (cluster.DaskRunner)."""

    def __call__(self, jobs: list[Job], progress: Optional[Progress], shared: SharedValues,
                 on_dump: Optional[OnDump] = None) -> tuple[list[LoadOutcome], list[str]]:
        """`(an outcome per job in their order, notes)`."""


class Dispatcher(Protocol):
    """Runs load jobs on a cluster whose workers keep the results (cluster.DaskRunner)."""

    def dispatch(self, jobs: list[Job], progress: Optional[Progress] = None) -> tuple[list[Any], list[str]]:
        """`(parts, notes)`: see RemoteLoad."""


def _for_transfer(results: list[LoadOutcome]) -> list[LoadOutcome]:
    # Every rank lists the whole world in its default group: sent as a range where the
    # ranks run without a gap (a few bytes, where 16,384 ranks took 128 KB), else as
    # arrays (one per list in the batch, which the pickle then writes once) that the parent
    # reads as bytes; it keeps one tuple per distinct list (see SharedValues).
    arrays: dict[int, tuple[Sequence[int], array[int]]] = {}  # id(ranks) -> (ranks, its array): holding ranks keeps the id its own
    for dump in results:
        if isinstance(dump, RankDump):
            dump.pg_config = tuple(config._replace(ranks=_packed_ranks(config.ranks, arrays))  # type: ignore[arg-type]
                                   if config.ranks else config for config in dump.pg_config)  # (see _received)
    return results


def _load_batch_mapped(transform: Callable[[int, LoadOutcome], _Mapped], jobs: list[Job]) -> list[_Mapped]:
    """`transform(rank, load_one(...))` for a few files in a worker process: only what
    `transform` returns travels back (see iter_dump_files)."""
    memo = BatchMemo()
    return [transform(job[0], load_one(*job, memo=memo)) for job in jobs]


def _packed_ranks(ranks: Sequence[int], arrays: dict[int, tuple[Sequence[int], array[int]]]) -> range | array[int]:
    """A sorted list of distinct ranks as it travels: a range when its ranks are evenly
    spaced (every default group, and every DP group: each TP x PP-th rank), else an array."""
    if isinstance(ranks, (array, range)):  # packed already (by a child process of a worker)
        return ranks
    spaced = _evenly_spaced(ranks)
    if spaced is not None:
        return spaced
    if id(ranks) not in arrays:
        arrays[id(ranks)] = (ranks, array("q", ranks))
    return arrays[id(ranks)][1]


def _evenly_spaced(ranks: Sequence[int]) -> Optional[range]:
    """`ranks` (sorted, distinct: normalise.rank_list) as a range, when they are one."""
    first, last = ranks[0], ranks[-1]
    step = ranks[1] - first if len(ranks) > 1 else 1
    if last - first != step * (len(ranks) - 1):
        return None
    spaced = range(first, last + 1, step)
    # Without a gap the bounds say it all; spaced otherwise, each rank is checked (in C).
    return spaced if step == 1 or all(map(operator.eq, ranks, spaced)) else None


def _received(result: Sent, shared: SharedValues) -> tuple[LoadOutcome, Optional[GroupParts]]:
    """`(RankDump or LoadIssue, its GroupParts or None)` for a result from a worker, its
    values shared with the other ranks' (see SharedValues)."""
    parts = None
    if isinstance(result, DealtDump):
        outcome: LoadOutcome
        outcome, parts = result
    else:
        outcome = result
    if isinstance(outcome, RankDump):
        outcome.entries.share(shared)  # in place: the parts read the same table
        _share_rank_lists(outcome, shared)
    return outcome, parts


def load_dumps(
    inputs: Sequence[object],
    prefix: Optional[str] = None,
    *,
    workers: int = 1,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    selected_ranks: Optional[Iterable[int]] = None,
    progress: Optional[Progress] = None,
    on_dump: Optional[OnDump] = None,
    all_generations: bool = False,
    runner: Optional[Runner] = None,
) -> LoadResult:
    """Find and load every dump under `inputs` (directories, files, archives, URLs): of
    the newest complete generation only, unless `all_generations` (see discover_dump_files).
    `selected_ranks` keeps only the files of those ranks (by the rank in their name),
    before any is decoded. `on_dump(dump, parts)` is called in this process with each
    dump as it arrives (OnDump): work done there overlaps the workers', and the workers
    deal each dump's entries by group for it. `runner(jobs, progress, shared,
    on_dump)` replaces the local process pool (cluster.DaskRunner); it returns the
    results in job order and notes."""
    found = discover_dump_files([as_input(p) for p in inputs], prefix, all_generations, max_bytes)
    files = found.files
    if selected_ranks is not None:
        wanted = set(selected_ranks)
        files = select_files(files, wanted.__contains__)
    return load_dump_files(files, found, workers=workers, max_bytes=max_bytes, progress=progress, on_dump=on_dump,
                           inputs=tuple(str(p) for p in inputs), runner=runner)


def select_files(files: list[RankFile], wanted: Callable[[int], bool]) -> list[RankFile]:
    """The `(rank, path)` pairs of `files` whose rank (from the file name) is `wanted`:
    choosing ranks before reading, so the other files are never opened."""
    return [(rank, path) for rank, path in files if wanted(rank)]


def load_dump_files(files: list[RankFile], found: Discovery, *, workers: int = 1,
                    max_bytes: int = DEFAULT_MAX_FILE_BYTES, progress: Optional[Progress] = None,
                    on_dump: Optional[OnDump] = None, inputs: tuple[str, ...] = (),
                    runner: Optional[Runner] = None) -> LoadResult:
    """Load `files` (`(rank, path)` pairs, from `found.files` or a selection of them),
    found under `inputs` (as given), in this machine's processes or with `runner`."""
    notes = list(found.notes)
    if runner is None:
        results = [result for _, result in iter_dump_files(files, workers=workers, max_bytes=max_bytes,
                                                            progress=progress, on_dump=on_dump)]
    else:
        results, run_notes = runner(_jobs(files, max_bytes), progress, SharedValues(), on_dump)
        notes += list(run_notes)
    return _load_result(files, found, results, notes, inputs)


def _load_result(files: list[RankFile], found: Discovery, results: list[LoadOutcome], notes: list[str],
                 inputs: tuple[str, ...]) -> LoadResult:
    """The LoadResult of `files`, given a RankDump or LoadIssue per file (in their order)."""
    dumps: list[RankDump] = []
    errors: list[LoadIssue] = list(found.refused)
    for (_, path), result in zip(files, results):
        if isinstance(path, Path) and isinstance(result, (RankDump, LoadIssue)):
            # Read through an absolute path on a cluster's worker (cluster._from_anywhere):
            # named as this process found it, as a local run names it.
            result.path = str(path)
        if isinstance(result, RankDump):
            dumps.append(result)
        else:
            errors.append(result)
    failed = tuple(sorted(rank for (rank, _), result in zip(files, results) if not isinstance(result, RankDump)))
    return LoadResult(dumps=dumps, skipped=found.skipped, errors=errors, prefix=found.prefix, failed_ranks=failed,
                      notes=notes, inputs=inputs)


class RemoteLoad(NamedTuple):
    """Dumps read on a cluster whose entries stayed on its workers (`dispatch_load`): per
    batch of files, in their order, the Future of its results or the LoadIssues of a batch
    that failed. Passed to a task on that cluster, the Futures arrive as the results, and
    `taken` makes the LoadResult there."""

    files: list[RankFile]
    found: Discovery
    # Per batch: a dask Future (untyped) of its list[Sent], which a task on the cluster
    # receives as that list, or the LoadIssues of a batch that failed.
    parts: list[Any]
    notes: list[str]
    inputs: tuple[str, ...]

    def taken(self, on_dump: Optional[OnDump] = None) -> LoadResult:
        """The LoadResult of the parts as a worker received them (`on_dump` with each dump)."""
        results: list[LoadOutcome] = []
        shared = SharedValues()
        for part in self.parts:
            take_batch(part, results, len(self.files), shared, on_dump)
        return _load_result(self.files, self.found, results, list(self.found.notes) + list(self.notes), self.inputs)


def dispatch_load(inputs: Sequence[object], runner: Dispatcher, prefix: Optional[str] = None, *,
                  max_bytes: int = DEFAULT_MAX_FILE_BYTES, progress: Optional[Progress] = None,
                  all_generations: bool = False) -> RemoteLoad:
    """Find the dumps under `inputs` and have `runner` (cluster.DaskRunner) read them, each
    dump dealt by group on the worker that read it, where its entries stay (see RemoteLoad)."""
    found = discover_dump_files([as_input(p) for p in inputs], prefix, all_generations, max_bytes)
    parts, notes = runner.dispatch(_jobs(found.files, max_bytes), progress)
    return RemoteLoad(found.files, found, parts, notes, tuple(str(p) for p in inputs))


@overload
def iter_dump_files(files: list[RankFile], *, workers: int = ..., max_bytes: int = ...,
                    progress: Optional[Progress] = ..., on_dump: Optional[OnDump] = ...,
                    transform: None = ...) -> Iterator[tuple[int, LoadOutcome]]: ...


@overload
def iter_dump_files(files: list[RankFile], *, workers: int = ..., max_bytes: int = ...,
                    progress: Optional[Progress] = ..., on_dump: Optional[OnDump] = ...,
                    transform: Callable[[int, LoadOutcome], _Mapped]) -> Iterator[tuple[int, _Mapped]]: ...


# A transform that may be None: what comes out depends on which, which the caller knows.
@overload
def iter_dump_files(files: list[RankFile], *, workers: int = ..., max_bytes: int = ...,
                    progress: Optional[Progress] = ..., on_dump: Optional[OnDump] = ...,
                    transform: Optional[Callable[[int, LoadOutcome], object]]) -> Iterator[tuple[int, Any]]: ...


def iter_dump_files(files: list[RankFile], *, workers: int = 1, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
                    progress: Optional[Progress] = None,
                    on_dump: Optional[OnDump] = None,
                    transform: Optional[Callable[[int, LoadOutcome], object]] = None) -> Iterator[tuple[int, object]]:
    """`(rank, RankDump or LoadIssue)` for each of `files`, in their order, as each is
    decoded: a caller that prints as it goes (`-j`) need not wait for, nor keep, them all.

    With `transform` (a picklable function of `(rank, RankDump or LoadIssue)`), yields
    `(rank, transform(rank, result))` instead, computed in the worker processes: when
    only a little of each dump is wanted (-j's newest entries of each rank), the dumps
    never travel to this process."""
    return _run_jobs(_jobs(files, max_bytes), workers, progress, SharedValues(), on_dump, transform)


def _jobs(files: list[RankFile], max_bytes: int) -> list[Job]:
    """One load job per `(rank, path)`: a local path travels as text, a Source as itself.
    Each file gets an equal share of the run's inflation floor: however many small gzip
    bombs a run holds, together they inflate past the gzip ratio by 64 MB at most."""
    drop = _inputs_crowd_memory([path for _, path in files])
    floor = _GZIP_RATIO_FLOOR // max(1, len(files))
    return [(rank, path if isinstance(path, Source) else str(path), max_bytes, drop, floor) for rank, path in files]


def _share_rank_lists(dump: RankDump, shared: SharedValues) -> None:
    """Keep one tuple per distinct pg_config rank list, as each dump arrives. Every NCCL
    rank lists the whole world in its default group: at 16,384 ranks, copies of it kept
    until the end of the load took 10 GB."""
    if any(config.ranks for config in dump.pg_config):
        dump.pg_config = tuple(config._replace(ranks=shared.rank_list(config.ranks)) if config.ranks else config
                               for config in dump.pg_config)


# Files per batch of the local pool, at most: a batch is one task of a worker process.
POOL_BATCH_FILES = 16
# Every file of a job lists the group of all ranks, which a batch parses once (BatchMemo):
# 4 ms at 32,768 ranks, a tenth of a short file's decoding when batches hold 16. From this
# many files on, the pool's batches hold up to LARGE_JOB_BATCH_FILES.
LARGE_JOB_FILES = 16384
LARGE_JOB_BATCH_FILES = 64


def job_batches(jobs: list[Job], workers: int, most: Optional[int] = None) -> list[list[Job]]:
    """The jobs in batches of up to `most` (by default POOL_BATCH_FILES, or
    LARGE_JOB_BATCH_FILES for a large job), at least 8 per worker while there are files
    enough (each batch is one task), the first few smaller and, after batches larger than
    POOL_BATCH_FILES, the last few too (see _batches)."""
    if most is None:
        most = LARGE_JOB_BATCH_FILES if len(jobs) >= LARGE_JOB_FILES else POOL_BATCH_FILES
    size = max(1, min(most, len(jobs) // (8 * workers)))
    if size <= POOL_BATCH_FILES:
        return _batches(jobs, size)
    # The workers finish together: the last batch of each is no longer than the pool's usual.
    tail = min(len(jobs), size * workers)
    return _batches(jobs[:len(jobs) - tail], size) + _batches(jobs[len(jobs) - tail:], POOL_BATCH_FILES, growing=False)


# A batch's results as a task sends them: the results, or (from a cluster's worker,
# cluster_worker.load_batch_on_worker) the pickle of them.
SentBatch = Union[Sequence[Sent], bytes]


def take_batch(batch: SentBatch, results: list[LoadOutcome], total: int, shared: SharedValues,
               on_dump: Optional[OnDump] = None, progress: Optional[Progress] = None) -> None:
    """Receive a worker's batch of results into `results`, in this process (see _received).
    A pickled batch is this program's own records, read back as a forked child's are."""
    sent_batch: Sequence[Sent] = (OwnResultUnpickler(io.BytesIO(batch)).load() if isinstance(batch, bytes)
                                  else batch)
    for sent in sent_batch:
        result, parts = _received(sent, shared)
        results.append(result)
        if on_dump and isinstance(result, RankDump):
            on_dump(result, parts)
    if progress:
        progress(len(results), total)


def _batches(jobs: list[Job], size: int, growing: bool = True) -> list[list[Job]]:
    """`jobs` cut into batches of `size`, the first few smaller (1, 2, 4, ...) when
    `growing`: the first dumps arrive as soon as one file is decoded, for a caller that
    prints as it goes."""
    batches: list[list[Job]] = []
    start, step = 0, 1 if growing else size
    while start < len(jobs):
        batches.append(jobs[start:start + step])
        start += step
        step = min(size, step * 2)
    return batches


def _run_jobs(jobs: list[Job], workers: int, progress: Optional[Progress], shared: SharedValues,
              on_dump: Optional[OnDump] = None,
              transform: Optional[Callable[[int, LoadOutcome], object]] = None) -> Iterator[tuple[int, object]]:
    """`(rank, result)` per job, in the jobs' order (`transform(rank, result)` with one)."""
    # Worker processes only pay off once there are many files to spread.
    if workers <= 1 or len(jobs) < 2 * workers:
        memo = BatchMemo()
        for done, job in enumerate(jobs, 1):
            outcome = load_one(*job, shared=shared, memo=memo)
            result: object = outcome
            if transform is not None:
                result = transform(job[0], outcome)
            elif isinstance(outcome, RankDump):
                _share_rank_lists(outcome, shared)
                if on_dump:
                    on_dump(outcome, None)
            if progress:
                progress(done, len(jobs))
            yield job[0], result
        return
    batches = iter(job_batches(jobs, workers))
    done = 0
    pool = ProcessPoolExecutor(max_workers=workers)
    finished = False
    try:
        # A few batches in flight per worker, not all of them: when the workers outpace
        # this process, finished batches would otherwise pile up here (gigabytes at 16k ranks).
        work: Callable[[list[Job]], Sequence[object]] = (
            functools.partial(_load_batch_for_transfer, deal=on_dump is not None) if transform is None
            else functools.partial(_load_batch_mapped, transform))
        pending = deque((batch, pool.submit(work, batch)) for batch in islice(batches, 3 * workers))
        while pending:
            batch_jobs, future = pending.popleft()
            batch = future.result()
            pending.extend((more, pool.submit(work, more)) for more in islice(batches, 1))
            done += len(batch)
            if progress:
                progress(done, len(jobs))
            for job, result in zip(batch_jobs, batch):
                if transform is None:  # then the batch is what _load_batch_for_transfer sends
                    result, parts = _received(cast(Sent, result), shared)
                    if on_dump and isinstance(result, RankDump):
                        on_dump(result, parts)
                yield job[0], result
        finished = True
    finally:
        if not finished:
            # A consumer that stopped early (its reader gone: `frtrace -j | head`) does not
            # wait for the batches in flight, and the process may end at once (os._exit),
            # before the pool's own thread could tell the workers: end them now, or they
            # would wait for work forever, holding the pipe the output went to.
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)
