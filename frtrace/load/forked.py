"""Work done in a forked child process, its result sent back through a pipe (or, with
`start_spilling`, left in a temporary file).

Takes a function and its arguments; `Forked.start` forks a child computing it and returns
a handle, whose `collect()` returns `(result, None)`, or `(None, exit code)` when the
child died or sent nothing. `in_children` (and `each_in_children`, which gives each result
as it comes in) computes a function of several shares of work at once, one here and each
other in a child (the matcher's groups, the diagnosis's went-past questions, a rule's
groups), the children forked as a tree (`Forked.start_each`) so that this process forks
once. The loader decodes in one, so that a pickle which crashes the decoder costs one file
and not the process (load/loader.py).

The child is this program working on data it has checked: its pickle of the result is
read back allowing frtrace's own records only (`OwnResultUnpickler`), never another
module's callables.
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import tempfile
from typing import Callable, Generic, Iterator, Optional, Sequence, TypeVar

_Result = TypeVar("_Result")


class OwnResultUnpickler(pickle.Unpickler):
    """Reads what another process of this program pickled (a child's result, a parent's
    request to a forked server, a cluster task's batch): frtrace's own records (and the
    arrays and sets they hold), never another module's callables."""

    _ALLOWED = {("array", "array"), ("array", "_array_reconstructor"), ("builtins", "frozenset"),
                ("builtins", "set"), ("builtins", "range"), ("builtins", "slice")}

    def find_class(self, module: str, name: str) -> Callable[..., object]:
        if module.startswith("frtrace.") or (module, name) in self._ALLOWED:
            found: Callable[..., object] = super().find_class(module, name)  # typeshed says Any
            return found
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in a child's result")


class Forked(Generic[_Result]):
    """A forked child computing a function; `collect()` its result."""

    __slots__ = ("pid", "_read_fd", "_waited", "_spilled")

    def __init__(self, pid: Optional[int], read_fd: int, spilled: bool = False) -> None:
        self.pid = pid  # None: a child of another child (start_each), not ours to wait for
        self._read_fd = read_fd
        self._waited = pid is None
        self._spilled = spilled  # read_fd is a file the child wrote (start_spilling), not a pipe

    @classmethod
    def start(cls, function: Callable[..., _Result], *args: object) -> Forked[_Result]:
        """Fork a child computing `function(*args)`. Raises OSError when the system will
        not fork (out of processes or memory). Needs os.fork."""
        read_fd, write_fd = os.pipe()
        try:
            pid = _fork_writing(function, args, write_fd, read_fd)
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        os.close(write_fd)
        return cls(pid, read_fd)

    @classmethod
    def start_spilling(cls, function: Callable[..., _Result], *args: object) -> Forked[_Result]:
        """`start`, the child writing its result to an unnamed temporary file rather than a
        pipe, so that it is gone as soon as it is done, however late its result is read:
        a pipe holds 64 KiB, and a child with more to send lives on until it is read,
        while every page this process writes is copied for it. Raises OSError as `start`."""
        with tempfile.TemporaryFile() as spill:
            fd = os.dup(spill.fileno())
        try:
            pid = _fork_writing(function, args, fd)
        except OSError:
            os.close(fd)
            raise
        return cls(pid, fd, spilled=True)

    @classmethod
    def try_start(cls, function: Callable[..., _Result], *args: object,
                  spilling: bool = False) -> Optional[Forked[_Result]]:
        """`start` (`start_spilling` with `spilling`), or None where the system will not
        fork (or has no os.fork at all)."""
        try:
            return cls.start_spilling(function, *args) if spilling else cls.start(function, *args)
        except (OSError, AttributeError):
            return None

    @classmethod
    def start_each(cls, function: Callable[[_Share], _Result], shares: Sequence[_Share]) -> list[Optional[Forked[_Result]]]:
        """A child computing `function(share)` for each of `shares`, forked as a tree: this
        process forks one child, which forks a child for half of its shares, and each does
        the same with what it keeps, down to one share each (`_grow`). A fork of a large
        process copies its page tables (37 ms at 16,384 ranks on 16 cores), so this
        process pays for one fork and the last child starts after about log2 of the
        shares' forks, not all of them. A handle per share, in order (only the first is
        this process's child: `reap` it); all None where this process cannot fork. A child
        that cannot fork its part computes it itself; a share whose child died reads back
        as no result, left to the caller."""
        if not shares:
            return []
        pipes = [os.pipe() for _ in shares]
        try:
            pid = os.fork()
        except (OSError, AttributeError):
            for read_fd, write_fd in pipes:
                os.close(read_fd)
                os.close(write_fd)
            return [None] * len(shares)
        if pid == 0:  # the first child: its part of the tree, then leave without the parent's cleanup
            code = 1
            try:
                faulthandler.disable()  # as in start
                for read_fd, _ in pipes:
                    os.close(read_fd)
                _grow(function, shares, [write_fd for _, write_fd in pipes])
                code = 0
            finally:
                os._exit(code)
        for _, write_fd in pipes:
            os.close(write_fd)
        return [cls(pid if index == 0 else None, read_fd) for index, (read_fd, _) in enumerate(pipes)]

    def collect(self, wait: bool = True) -> tuple[Optional[_Result], Optional[int]]:
        """`(result, None)` once the child is done, or `(None, its exit code)` when it
        died or sent nothing. Without `wait`, a child that sent its result and is still
        exiting is not waited for: a child of a large process takes milliseconds to give
        back its copy of the parent's memory, which `reap` waits for later."""
        if self._spilled:
            return self._collect_spilled()
        with open(self._read_fd, "rb", closefd=True) as pipe:
            payload = pipe.read()  # before waiting: a large result would fill the pipe
        if self.pid is None:  # its parent waits for it; a cut or missing result does not read back
            return (OwnResultUnpickler(io.BytesIO(payload)).load(), None) if payload else (None, None)
        exited, status = os.waitpid(self.pid, 0 if wait or not payload else os.WNOHANG)
        if exited == 0:  # still exiting, its whole result sent (a cut one does not read back)
            return OwnResultUnpickler(io.BytesIO(payload)).load(), None
        self._waited = True
        exitcode = os.waitstatus_to_exitcode(status)
        if exitcode != 0 or not payload:
            return None, exitcode
        return OwnResultUnpickler(io.BytesIO(payload)).load(), None

    def _collect_spilled(self) -> tuple[Optional[_Result], Optional[int]]:
        """`collect` of a child that wrote its file (start_spilling): read once it is gone."""
        assert self.pid is not None
        _, status = os.waitpid(self.pid, 0)
        self._waited = True
        exitcode = os.waitstatus_to_exitcode(status)
        os.lseek(self._read_fd, 0, os.SEEK_SET)  # the child's writes moved the offset both share
        with open(self._read_fd, "rb", closefd=True) as spill:
            payload = spill.read() if exitcode == 0 else b""
        if not payload:
            return None, exitcode
        return OwnResultUnpickler(io.BytesIO(payload)).load(), None

    def result(self, wait: bool = True) -> Optional[_Result]:
        """The child's result once it is done; None when it died, sent nothing, or sent
        what does not read back (work given to a child is then done by the caller).
        `wait` as for `collect`."""
        try:
            result, _ = self.collect(wait)
        except (pickle.UnpicklingError, EOFError, OSError):
            self.reap()
            return None
        return result

    def reap(self) -> None:
        """Wait for the child to be gone, if no one has yet (after `collect(wait=False)`)."""
        if not self._waited and self.pid is not None:
            self._waited = True
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped already (by a test's stand-in, say)
                pass

    def discard(self) -> None:
        """Give up on a result never read: the child reaped, its pipe or file closed."""
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        self.reap()


def _fork_writing(function: Callable[..., object], args: tuple[object, ...], write_fd: int,
                  parents_fd: Optional[int] = None) -> int:
    """Fork a child that writes the pickle of `function(*args)` to `write_fd` (a pipe's
    end or a file) and leaves without running any cleanup of the parent's, closing first
    `parents_fd` (the pipe's other end); in the parent, the child's pid. Raises OSError
    when the system will not fork."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # A failure is the parent's to report, in one line: a fault handler inherited
            # from it (python -X faulthandler, pytest) would add a traceback to stderr.
            faulthandler.disable()
            if parents_fd is not None:
                os.close(parents_fd)
            with open(write_fd, "wb", closefd=True) as out:
                pickle.dump(function(*args), out, protocol=pickle.HIGHEST_PROTOCOL)
            code = 0
        finally:
            os._exit(code)
    return pid


_Share = TypeVar("_Share")

# Work is forked off only where this many processes may run. A child copies every page
# it or its parent writes while both live (reference counts change wherever either reads):
# at 4,096 ranks with 2 processes the run's peak proportional memory grew from 572 MB to
# 821 MB for 5 % of its time; with more cores the share of the work each child takes
# grows, and the tail of the run (alone in one process before) shrinks.
FORK_FROM_PROCESSES = 4


def may_fork(processes: int) -> bool:
    """Whether work may be forked off when `processes` may run (FORK_FROM_PROCESSES)."""
    return processes >= FORK_FROM_PROCESSES


def in_children(function: Callable[[_Share], _Result], shares: Sequence[_Share]) -> list[_Result]:
    """`function(share)` of each of `shares`, in their order: the first computed here, each
    other in a forked child meanwhile (which inherits the share: nothing is sent to it).
    A child that cannot fork, dies, or sends what does not read back has its share
    computed here: a failure costs time, never a different answer."""
    return list(each_in_children(function, shares))


def each_in_children(function: Callable[[_Share], _Result], shares: Sequence[_Share]) -> Iterator[_Result]:
    """`in_children`, each result given as soon as it is in (the first, computed here,
    first), so that the caller can work on it while the later children still run. Every
    child is reaped, also when the caller stops early; a child still exiting once its
    result is in is reaped at the end."""
    children = Forked.start_each(function, shares[1:])
    collected: list[Forked[_Result]] = []
    try:
        if shares:
            yield function(shares[0])
        for index, share in enumerate(shares[1:]):
            child, children[index] = children[index], None
            result = None
            if child is not None:
                collected.append(child)
                result = child.result(wait=False)
            yield result if result is not None else function(share)
    finally:
        # Every result is read before any child is waited for: a child of the tree waits for
        # its own children, which may wait for this process to read what they send.
        for child in children:
            if child is not None:
                collected.append(child)
                child.result(wait=False)  # unwanted: only read
        for child in collected:
            child.reap()


def _grow(function: Callable[[_Share], _Result], shares: Sequence[_Share], write_fds: list[int]) -> None:
    """In a child of `Forked.start_each`, holding the pipes of `shares`: fork a child for
    the later half of its shares while it holds more than one (each keeps only its own
    pipes), send the result of the one left (of each left, where a fork failed), then
    wait for the children it forked."""
    low, high = 0, len(shares)
    children: list[int] = []
    try:
        while high - low > 1:
            middle = (low + high + 1) // 2
            try:
                pid = os.fork()
            except OSError:
                break  # no more children: this one computes the shares it holds
            if pid == 0:
                children = []  # the parent's are not this one's to wait for
                for fd in write_fds[low:middle]:
                    os.close(fd)
                low = middle
            else:
                children.append(pid)
                for fd in write_fds[middle:high]:
                    os.close(fd)
                high = middle
        for index in range(low, high):
            with open(write_fds[index], "wb", closefd=True) as pipe:
                pickle.dump(function(shares[index]), pipe, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        for pid in children:
            os.waitpid(pid, 0)
