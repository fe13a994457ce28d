"""A forked child process that computes one function for request after request.

Takes a function; `ForkedServer.start(function)` forks a child that waits for requests,
and `call(*args)` sends it one (its arguments pickled: this process's own data), returns
`(function(*args), None)`, or `(None, exit code)` when the child died on it
(`call_pickled`: the result as the child pickled it); a dead server serves no more
(`alive`), and its owner starts another. `close()` ends the child.

The loader decodes in one on a dask worker (load/cluster.py): there a process runs other
threads, so decoding must happen in a single-threaded child for the address-space cap to
hold (loader._decoding_is_capped), and one hostile pickle must cost its batch, not the
worker. Forking a child per batch did both, but a worker is a large process: forking it,
and the copy-on-write faults that follow, cost about 40 ms a batch, more than decoding
the 16 files a batch then held. One child serves every batch of its worker thread instead.

The child's replies are read back as `forked.Forked`'s are (`OwnResultUnpickler`:
frtrace's own records only, never another module's callables).
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import signal
import struct
from typing import Any, Callable, Optional

from frtrace.load.forked import OwnResultUnpickler

# Each message: its length (8 bytes, unsigned, big-endian), then a pickle.
_LENGTH = struct.Struct(">Q")


class ForkedServer:
    """A forked child computing `function` for each `call` (see the module doc)."""

    __slots__ = ("pid", "_requests", "_replies", "_exitcode")

    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid = pid
        self._requests = requests  # write end: this process to the child
        self._replies = replies  # read end: the child to this process
        self._exitcode: Optional[int] = None

    @classmethod
    def start(cls, function: Callable[..., Any]) -> "ForkedServer":
        """Fork a child serving `function`. OSError when the system will not fork. Needs os.fork."""
        to_child_read, to_child_write = os.pipe()
        to_parent_read, to_parent_write = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (to_child_read, to_child_write, to_parent_read, to_parent_write):
                os.close(fd)
            raise
        if pid == 0:  # the child: serve until the parent closes its end, then leave without cleanup
            code = 1
            try:
                # A failure is the parent's to report, in one line (see forked.Forked).
                faulthandler.disable()
                _keep_only(to_child_read, to_parent_write)
                _serve(function, to_child_read, to_parent_write)
                code = 0
            finally:
                os._exit(code)
        os.close(to_child_read)
        os.close(to_parent_write)
        return cls(pid, to_child_write, to_parent_read)

    @property
    def alive(self) -> bool:
        return self._exitcode is None

    def call(self, *args: Any) -> tuple[Any, Optional[int]]:
        """`(function(*args), None)` computed by the child; `(None, exit code)` when it died
        on this request (or had died before), after which it serves no more."""
        reply, exitcode = self.call_pickled(*args)
        if reply is None:
            return None, exitcode
        return OwnResultUnpickler(io.BytesIO(reply)).load(), None

    def call_pickled(self, *args: Any) -> tuple[Optional[bytes], Optional[int]]:
        """As `call`, the result left pickled: for a caller that only passes it on (a dask
        worker's task), whose receiver reads it as `call` would (`OwnResultUnpickler`)."""
        if not self.alive:
            return None, self._exitcode
        try:
            _send(self._requests, pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))
            reply = _receive(self._replies)
        except OSError:
            reply = None
        if reply is None:
            return None, self._end()
        return bytes(reply), None

    def close(self) -> None:
        """End the child and reap it."""
        if self.alive:
            self._end(kill=True)

    def _end(self, kill: bool = False) -> int:
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        if kill:  # idle, it would leave on the closed pipe; killed, it cannot linger
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(self.pid, 0)
        self._exitcode = os.waitstatus_to_exitcode(status)
        return self._exitcode


def _keep_only(*fds: int) -> None:
    """Close every descriptor of this (child) process but the standard streams and `fds`:
    a child keeping a copy of another server's request pipe would keep that server from
    ever seeing its requests end (and the parent's sockets are not the child's business)."""
    keep = sorted({0, 1, 2, *fds})
    top = max(keep[-1] + 1, _highest_descriptor())
    for low, high in zip(keep, keep[1:] + [top]):
        os.closerange(low + 1, high)


def _highest_descriptor() -> int:
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024


def _serve(function: Callable[..., Any], requests: int, replies: int) -> None:
    """The child's loop: a request in, `function`'s result out, until the requests end.
    A request is its parent's own records (file names, jobs, a file's bytes), read as
    replies are: frtrace's records only, never another module's callables."""
    while True:
        request = _receive(requests)
        if request is None:
            return
        result = function(*OwnResultUnpickler(io.BytesIO(request)).load())
        _send(replies, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))


def _send(fd: int, payload: bytes) -> None:
    _write_all(fd, _LENGTH.pack(len(payload)))
    _write_all(fd, payload)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _receive(fd: int) -> Optional[bytearray]:
    """The next message, or None when the other end closed (or died) before a whole one."""
    header = _read_exactly(fd, _LENGTH.size)
    if header is None:
        return None
    return _read_exactly(fd, _LENGTH.unpack(header)[0])


def _read_exactly(fd: int, size: int) -> Optional[bytearray]:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        read = os.readv(fd, [view[got:]])
        if read == 0:
            return None
        got += read
    return buffer
