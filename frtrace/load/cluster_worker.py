"""What runs on a dask worker for `--scheduler`: the task that reads a batch of files,
and the decoder children it decodes them in.

Takes a batch of the loader's jobs; `load_batch_on_worker` returns what
`loader._load_batch_for_transfer` returns for it, pickled. A dask worker runs other
threads, so each batch is decoded in a single-threaded child (loader._decoding_is_capped):
here, one of the `DecoderChildren` that the plugin of that name keeps on each worker, a
forked child per worker thread that serves batch after batch (forked_server.ForkedServer),
where forking one per batch cost about 40 ms a batch. The child decodes and deals the
files and pickles what it sends; the worker passes that pickle on unread. A child that
dies on a batch (a hostile pickle) costs that batch, as before; the next batch gets a new
child.

This module imports dask's `distributed`: only the cluster's workers, and the runner
that registers the plugin (cluster.DaskRunner), import it.
"""

from __future__ import annotations

import pickle
import queue
from typing import Any, Optional

import distributed

from frtrace.load.forked_server import ForkedServer
from frtrace.load.loader import (
    Job,
    Sent,
    _decoding_is_capped,
    _load_batch_for_transfer,
    crashed_batch,
    decode_batch,
    read_batch,
)

PLUGIN_NAME = "frtrace-decoder-children"


class DecoderChildren(distributed.WorkerPlugin):
    """The idle decoder children of one worker (see the module doc)."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self._idle: Optional[queue.SimpleQueue[ForkedServer]] = None  # made on the worker (setup)

    def setup(self, worker: Any) -> None:
        self._idle = queue.SimpleQueue()

    def teardown(self, worker: Any) -> None:
        while self._idle is not None and not self._idle.empty():
            self._idle.get_nowait().close()

    def load_pickled(self, jobs: list[Job], deal: bool) -> bytes:
        """What `_load_batch_for_transfer` sends for `jobs`, pickled: the files read here,
        decoded and dealt by an idle child of this worker (or a new one), whose pickle is
        passed on unread: the process that takes the batch up reads it (loader.take_batch)."""
        if self._idle is None:  # not set up: a queue of its own
            self._idle = queue.SimpleQueue()
        read = read_batch(jobs)
        try:
            server = self._idle.get_nowait()
        except queue.Empty:
            server = ForkedServer.start(decode_batch)
        reply, exitcode = server.call_pickled(jobs, read, deal)
        if server.alive:
            self._idle.put(server)
        return reply if reply is not None else _pickled(crashed_batch(jobs, read, exitcode))


def load_batch_on_worker(jobs: list[Job], deal: bool = False) -> bytes:
    """The task a worker runs on a batch of jobs: what `_load_batch_for_transfer` sends,
    pickled (`loader.take_batch` reads it where the batch is taken up), decoded in this
    worker's decoder children when the plugin is there. dask moves bytes between workers
    far faster than it moves these objects: fetching half of 4,096 ranks' results to the
    worker that analyses them took 1.27 s as objects, 0.04 s as bytes (and 0.24 s to
    unpickle them all there)."""
    try:
        children = distributed.get_worker().plugins.get(PLUGIN_NAME)
    except ValueError:  # not on a worker (called directly)
        children = None
    if isinstance(children, DecoderChildren) and not _decoding_is_capped():
        return children.load_pickled(jobs, deal)
    return _pickled(_load_batch_for_transfer(jobs, deal))


def _pickled(sent: list[Sent]) -> bytes:
    return pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL)
