"""Read and normalise the dump files on a Dask cluster's workers.

`DaskRunner.connect(address)` connects to a dask.distributed scheduler
(`tcp://10.0.0.5:8786`), or starts a LocalCluster for `local` / `local:N`; the runner
then takes the loader's jobs and returns the same per-rank results the local process
pool does, in job order: each task is `cluster_worker.load_batch_on_worker` on a batch of jobs,
run by a worker that reads the files itself (a local or shared path, an object in a
store through fsspec with the worker's own credentials, an archive member), and sends
back the compact entry tables. Matching and diagnosis stay with the caller.

What cannot be read is reported, never fatal once loading started: a batch whose worker
died (dask's KilledWorker after its retries) or that failed on the worker counts its
files as unreadable dumps, and losing the scheduler leaves the files not yet read so;
each cause is one note. A scheduler that cannot be reached, or without workers, is an
InputError before anything is read.

A task may also leave a file on its worker's disk (`file_on_this_worker`: an output made
where the analysis is); `WorkerFiles` reads it back here piece by piece, each piece a task
on that worker, so the process that asked holds one piece at a time, and removes it.

dask is imported here only, and this module only when `--scheduler` is given.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import os
from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Optional, TypeVar, Union

from frtrace.load.loader import (
    InputError,
    Job,
    LoadOutcome,
    OnDump,
    Progress,
    SentBatch,
    _load_batch_for_transfer,
    job_batches,
    take_batch,
)
from frtrace.load.safe_decode import _one_line
from frtrace.load.sources import TarMember, ZipMember, is_url
from frtrace.model import LoadIssue
from frtrace.table.entry_columns import SharedValues
from frtrace.util import fold_ranks, install_hint, plural

if TYPE_CHECKING:
    from distributed import Client, Future, LocalCluster

_Result = TypeVar("_Result")
_Fetched = TypeVar("_Fetched")
# What DaskRunner.dispatch keeps of a batch of jobs: the Future of its results (they stay on
# the worker), or a LoadIssue per job where it failed.
KeptBatch = Union["Future[SentBatch]", "list[LoadIssue]"]

INSTALL_HINT = install_hint("dask")
# An external cluster may still be starting its workers (a Slurm allocation, a Kubernetes
# deployment scaling up): wait this long for the first one.
WORKER_WAIT_SECONDS = 60.0
# Batches in flight per worker thread: enough to keep it busy while this process deals
# the results it already has, few enough that finished batches do not pile up here.
IN_FLIGHT_PER_THREAD = 3
# Files per task, at most: a dask task costs about 6 ms of its own (scheduling, the result
# kept on the worker), where the local pool's cost little. With 64, reading 4,096 ranks
# through `local:2` took 4.8-4.9 s against 5.9-6.1 s in batches of 16 (the pool: 4.2 s).
CLUSTER_BATCH_FILES = 64
# A file left on a worker comes back in pieces of this size (see WorkerFiles), each within
# this many seconds: a piece is a local read there, and a task bound to a worker that left
# the cluster would otherwise wait for it forever.
FILE_PIECE = 16 << 20
PIECE_SECONDS = 300.0


class WorkerFile(NamedTuple):
    """A file a task left on the disk of the worker that ran it (file_on_this_worker)."""

    worker: str  # that worker's address
    path: str
    size: int


def file_on_this_worker(path: str) -> WorkerFile:
    """Name `path`, a file on this machine, for `WorkerFiles` to read back: called in a
    task, on a worker (outside one, the worker's address is empty)."""
    import distributed

    try:
        address = distributed.get_worker().address
    except ValueError:  # not in a dask task
        address = ""
    return WorkerFile(address, path, os.path.getsize(path))


def _read_piece(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(size)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class WorkerFiles:
    """Reads back, here, the files tasks left on their workers (see the module doc)."""

    def __init__(self, runner: "DaskRunner") -> None:
        self._runner = runner

    def read(self, file: WorkerFile) -> Iterator[bytes]:
        """The bytes of `file`, a piece at a time, in order. OSError when its worker is
        gone or the file is no longer whole (it was made for this run only)."""
        for offset in range(0, file.size, FILE_PIECE):
            piece = self._on(file, _read_piece, file.path, offset, FILE_PIECE)
            if len(piece) != min(FILE_PIECE, file.size - offset):
                raise OSError(f"the file made on dask worker {file.worker} changed while it was read")
            yield piece

    def discard(self, file: WorkerFile) -> None:
        """Remove `file` from its worker's disk (nothing when the worker is gone)."""
        try:
            self._on(file, _remove, file.path)
        except OSError:
            pass

    def _on(self, file: WorkerFile, function: Callable[..., _Result], *args: object) -> _Result:
        """`function(*args)` run on `file`'s worker; OSError when that cannot be done."""
        if file.worker not in self._runner.worker_addresses():
            raise OSError(f"dask worker {file.worker}, which made it, has left the cluster")
        future = self._runner.client.submit(function, *args, workers=[file.worker], allow_other_workers=False,
                                            pure=False)
        try:
            return future.result(timeout=PIECE_SECONDS)
        except OSError:
            raise
        except Exception as exc:
            raise OSError(f"dask worker {file.worker}, which made it, did not send it ({_reason(exc)})") from None


def _dask() -> ModuleType:
    try:
        import distributed
    except ImportError:
        raise InputError(f"--scheduler needs dask.distributed: {INSTALL_HINT}") from None
    return distributed


def parse_local(address: str) -> Optional[int]:
    """Workers for `local` / `local:N` (None: not a local cluster); InputError for a bad N."""
    if address != "local" and not address.startswith("local:"):
        return None
    count = address.partition(":")[2]
    if not count:
        return max(1, os.cpu_count() or 1)
    if not count.isdigit() or int(count) < 1:
        raise InputError(f"--scheduler local:N takes a number of workers (1 or more), not {count!r}")
    return int(count)


class DaskRunner:
    """Runs the loader's jobs on a dask cluster (see the module doc)."""

    def __init__(self, client: Client, cluster: Optional[LocalCluster], address: str) -> None:
        self.client, self.cluster, self.address = client, cluster, address
        # What a worker runs on a batch of jobs (and whether to deal them by group).
        self.task: Callable[[list[Job], bool], SentBatch] = _load_batch_for_transfer
        self._plugin: Optional[str] = None  # the name of the workers' plugin this run registered

    @classmethod
    def connect(cls, address: str) -> "DaskRunner":
        distributed = _dask()
        workers = parse_local(address)
        # dask logs each lost worker and retried task at WARNING on stderr; this run says
        # what it means for the analysis in one line instead.
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        cluster = None
        try:
            if workers is not None:
                # No dashboard, and the scheduler's HTTP server on a free port: its default,
                # 8787, is taken by any other local cluster (a second frtrace run), and
                # dask then warns on stderr.
                cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                   dashboard_address=None, silence_logs=logging.CRITICAL,
                                                   scheduler_kwargs={"dashboard_address": ":0"})
                client = distributed.Client(cluster)
            else:
                client = distributed.Client(address)
        except Exception as exc:  # OSError, TimeoutError, ValueError for a malformed address ...
            if cluster is not None:
                cluster.close()
            what = "start a local dask cluster" if workers is not None else f"reach the dask scheduler at {address}"
            raise InputError(f"cannot {what} ({_reason(exc)})") from None
        runner = cls(client, cluster, address)
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except Exception:
            runner.close()
            raise InputError(f"no dask worker joined the scheduler at {address} within {WORKER_WAIT_SECONDS:.0f} s") from None
        runner._keep_decoder_children()
        return runner

    def _keep_decoder_children(self) -> None:
        """Have each worker keep decoder children across batches (cluster_worker.py); where
        the plugin cannot be registered, each batch forks a child of its own, as before."""
        from frtrace.load.cluster_worker import DecoderChildren, load_batch_on_worker

        try:
            self.client.register_plugin(DecoderChildren())
        except Exception:  # an older scheduler or worker: the task still works without it
            return
        self.task = load_batch_on_worker
        self._plugin = DecoderChildren.name

    def threads(self) -> int:
        nthreads: int = sum(w.get("nthreads", 1) for w in self._workers().values())
        return max(1, nthreads)

    def worker_addresses(self) -> set[str]:
        """The addresses of the workers in the cluster now."""
        return set(self._workers())

    def _workers(self) -> dict[str, dict[str, Any]]:
        try:
            info = self.client.scheduler_info(n_workers=-1)
        except TypeError:  # older distributed
            info = self.client.scheduler_info()
        except Exception:
            return {}
        workers: dict[str, dict[str, Any]] = info.get("workers", {})  # address -> what the scheduler says of it
        return workers

    def __call__(self, jobs: list[Job], progress: Optional[Progress], shared: SharedValues,
                 on_dump: Optional[OnDump] = None) -> tuple[list[LoadOutcome], list[str]]:
        """`(results in job order, notes)`: a RankDump or LoadIssue per job (see module doc)."""
        results: list[LoadOutcome] = []

        def take(batch: list[Job], outcome: SentBatch) -> None:
            take_batch(outcome, results, len(jobs), shared, on_dump, progress)

        notes = self._run(jobs, on_dump is not None, fetch=_result, take=take)
        return results, notes

    def dispatch(self, jobs: list[Job], progress: Optional[Progress] = None) -> tuple[list[KeptBatch], list[str]]:
        """`(parts, notes)`: the jobs run as for `__call__` (each dump dealt by group), but
        each batch's results stay on the worker that made them. `parts` holds, per batch
        in job order, its Future, or LoadIssues where it failed; `RemoteLoad.analysed`
        takes them up on a worker, so that no entry travels to this process."""
        parts: list[KeptBatch] = []
        done = 0

        def keep(batch: list[Job], outcome: KeptBatch) -> None:
            nonlocal done
            parts.append(outcome)
            done += len(batch)
            if progress:
                progress(done, len(jobs))

        notes = self._run(jobs, True, fetch=_finished, take=keep)
        return parts, notes

    def _run(self, jobs: list[Job], deal: bool, fetch: Callable[[Future[SentBatch]], _Fetched],
             take: Callable[[list[Job], Union[_Fetched, list[LoadIssue]]], None]) -> list[str]:
        """Run the jobs in batches, a few in flight per worker thread; `take(batch, outcome)`
        for each in job order, the outcome being what `fetch` makes of the batch's Future
        once its task finished (the results: `_result`; the Future itself, the results
        staying on the worker: `_finished`), or a LoadIssue per job where it failed.
        Returns the notes on what failed."""
        threads = self.threads()
        batches = deque(job_batches(jobs, threads, CLUSTER_BATCH_FILES))
        pending: deque[tuple[list[Job], Optional[Future[SentBatch]]]] = deque()
        failures: dict[str, list[int]] = {}  # note -> ranks
        lost: Optional[str] = None

        def submit(count: int) -> None:
            while batches and count > 0:
                batch = batches.popleft()
                sent = [_from_anywhere(job) for job in batch]
                pending.append((batch, self.client.submit(self.task, sent, deal, pure=False)))
                count -= 1

        submit(IN_FLIGHT_PER_THREAD * threads)
        while pending:
            batch, future = pending.popleft()
            outcome: Union[_Fetched, list[LoadIssue], None] = None
            if lost is None and future is not None:  # (a batch without a Future comes after `lost`)
                try:
                    outcome = fetch(future)
                except Exception as exc:
                    problem, lost = _classify_failure(exc, self.address)
                    if lost is None:
                        failures.setdefault(problem, []).extend(job[0] for job in batch)
                        outcome = [LoadIssue(str(job[1]), f"not read: {problem}") for job in batch]
            if outcome is None:  # the scheduler is gone: nothing more will come back
                assert lost is not None  # set whenever no outcome came back
                failures.setdefault(lost, []).extend(job[0] for job in batch)
                outcome = [LoadIssue(str(job[1]), f"not read: {lost}") for job in batch]
            else:
                submit(1)
            take(batch, outcome)
            if lost is not None and not pending and batches:
                pending.extend((batch, None) for batch in batches)
                batches.clear()
        return [f"error: {problem}: {plural(len(ranks), 'dump')} not read (rank {fold_ranks(ranks)}); "
                "they count as unreadable, the rest is analysed" for problem, ranks in failures.items()]

    def run_task(self, function: Callable[..., _Result], *args: object) -> _Result:
        """`function(*args)` run as one task on a worker of this cluster; its result here.
        Raises what the function raised; InputError when its worker died."""
        import distributed

        future = self.client.submit(function, *args, pure=False)
        try:
            return future.result()
        except distributed.KilledWorker:
            raise InputError("the analysis on the dask cluster failed: the worker holding it died "
                             "(out of memory? it holds every rank's entries)") from None
        except Exception as exc:
            if future.status == "error":  # raised by `function` itself (an InputError, a bug)
                raise
            problem, lost = _classify_failure(exc, self.address)
            raise InputError(f"the analysis on the dask cluster failed: {lost or problem}") from None

    def close(self) -> None:
        if self._plugin is not None and self.cluster is None:
            # Another's cluster: its workers end this run's decoder children now.
            try:
                self.client.unregister_worker_plugin(self._plugin)  # type: ignore[no-untyped-call]  # unannotated in distributed
            except Exception:  # the scheduler is gone: so are the workers' children, with them
                pass
        for part in (self.client, self.cluster):
            if part is not None:
                try:
                    part.close()
                except Exception:  # already gone: nothing to release
                    pass


def _from_anywhere(job: Job) -> Job:
    """`job` with its local path made absolute: a worker elsewhere does not share this
    process's working directory. The results name the file as given all the same
    (loader._load_result restores the paths of the files found; an archive member keeps
    its name, only the archive it is read from moves)."""
    path = job[1]
    if isinstance(path, str) and not os.path.isabs(path):
        return (job[0], os.path.abspath(path), *job[2:])
    if isinstance(path, (TarMember, ZipMember)) and not is_url(path.archive) and not os.path.isabs(path.archive):
        member = copy.copy(path)
        member.archive = os.path.abspath(path.archive)
        return (job[0], member, *job[2:])
    return job


def _result(future: Future[_Result]) -> _Result:
    """What `future`'s task returned, fetched to this process; raises what the task raised."""
    return future.result()


def _finished(future: Future[_Result]) -> Future[_Result]:
    """`future` once its task finished, without fetching its result; raises what the task raised."""
    import distributed

    distributed.wait([future])  # type: ignore[no-untyped-call]  # distributed leaves wait() unannotated
    if future.status == "error":
        exc = future.exception()  # type: ignore[no-untyped-call]  # unannotated in distributed
        raise exc if isinstance(exc, BaseException) else RuntimeError(str(exc))
    if future.status == "cancelled":
        raise concurrent.futures.CancelledError(f"task {future.key} was cancelled")
    return future


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return _one_line(f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text, 200)


def _classify_failure(exc: BaseException, address: str) -> tuple[str, Optional[str]]:
    """`(problem, lost)`: what to say about a batch that came back as an exception, and
    whether the scheduler itself is gone (then `lost` is the problem, for every batch left)."""
    import distributed
    from distributed.comm.core import CommClosedError

    if isinstance(exc, distributed.KilledWorker):
        return "a dask worker died while reading them", None
    if isinstance(exc, (CommClosedError, OSError, TimeoutError)) or type(exc).__name__ == "CancelledError":
        problem = f"lost the dask scheduler at {address} ({_reason(exc)})"
        return problem, problem
    return f"a dask worker failed ({_reason(exc)}; does it have frtrace's dask extra installed: pip install '.[dask]' in a checkout of frtrace?)", None
