"""A rule run on the other core: work that reads only the facts, done in a forked child
while the main process goes on with the rest of the diagnosis.

Takes a function of nothing (a rule bound to its `Facts`); `Aside.result()` returns what
it returns. The child works on a copy-on-write snapshot of the process taken when the
`Aside` is made, so it computes what the main process would; its result comes back
pickled through a pipe (forked.py), read allowing this package's records only. Where there is no child (no os.fork, other threads running, not
wanted) or the child failed, `result()` calls the function itself: the answer is the
same, only later.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Callable, Generic, Optional, TypeVar

from ..forked import Forked

T = TypeVar("T")


class Aside(Generic[T]):
    """`function()`, started in a forked child when `wanted` (see module docstring). Use as
    a context manager: leaving it unread ends and reaps the child."""

    def __init__(self, function: Callable[[], T], wanted: bool = True) -> None:
        self._function = function
        self._child: Optional[Forked] = None
        # A child forked while other threads run could inherit a lock one of them holds.
        if wanted and hasattr(os, "fork") and threading.active_count() <= 1:
            try:
                self._child = Forked.start(function)
            except OSError:  # out of processes or memory: computed here instead
                self._child = None

    @property
    def forked(self) -> bool:
        """Whether a child computes it (until `result()` reads it)."""
        return self._child is not None

    def result(self) -> T:
        if self._child is not None:
            child, self._child = self._child, None
            value, failure = child.collect()
            if failure is None:
                return value
        return self._function()

    def close(self) -> None:
        """End the child, if it is still running unread (the caller failed before reading)."""
        if self._child is not None:
            child, self._child = self._child, None
            child.end()

    def __enter__(self) -> "Aside[T]":
        return self

    def __exit__(self, kind: Optional[type], value: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.close()
