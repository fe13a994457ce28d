"""A rule run on the other core: work that reads only the facts, done in a forked child
while the main process goes on with the rest of the diagnosis.

Takes a function of nothing (a rule bound to its `Facts`); `Aside.result()` returns what
it returns. The child works on a copy-on-write snapshot of the process taken when the
`Aside` is made, so it computes what the main process would; its result comes back
pickled through a pipe, read allowing this package's records only (as the loader reads
its children's). Where there is no child (no os.fork, other threads running, not
wanted) or the child failed, `result()` calls the function itself: the answer is the
same, only later.
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import signal
import threading
from types import TracebackType
from typing import Callable, Generic, Optional, TypeVar

from ..loader import _OwnResultUnpickler

T = TypeVar("T")


class Aside(Generic[T]):
    """`function()`, started in a forked child when `wanted` (see module docstring). Use as
    a context manager: leaving it unread ends and reaps the child."""

    def __init__(self, function: Callable[[], T], wanted: bool = True) -> None:
        self._function = function
        self._child: Optional[tuple[int, int]] = None  # (pid, read end of its pipe)
        # A child forked while other threads run could inherit a lock one of them holds.
        if wanted and hasattr(os, "fork") and threading.active_count() <= 1:
            self._child = _fork(function)

    @property
    def forked(self) -> bool:
        """Whether a child computes it (until `result()` reads it)."""
        return self._child is not None

    def result(self) -> T:
        if self._child is not None:
            pid, read_fd = self._child
            self._child = None
            with open(read_fd, "rb", closefd=True) as pipe:
                payload = pipe.read()  # before waiting: a large result would fill the pipe
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) == 0 and payload:
                return _OwnResultUnpickler(io.BytesIO(payload)).load()
        return self._function()

    def close(self) -> None:
        """End the child, if it is still running unread (the caller failed before reading)."""
        if self._child is not None:
            pid, read_fd = self._child
            self._child = None
            os.close(read_fd)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)

    def __enter__(self) -> "Aside[T]":
        return self

    def __exit__(self, kind: Optional[type], value: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.close()


def _fork(function: Callable[[], object]) -> Optional[tuple[int, int]]:
    """(pid, read end of the pipe) of a child computing `function()`; None when the
    system will not fork (out of processes or memory): then the caller computes it."""
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:  # the child: compute, send, and leave without running any cleanup of the parent's
        code = 1
        try:
            faulthandler.disable()  # a failure is the parent's to handle (it computes it again)
            os.close(read_fd)
            with open(write_fd, "wb", closefd=True) as pipe:
                pickle.dump(function(), pipe, protocol=pickle.HIGHEST_PROTOCOL)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd
