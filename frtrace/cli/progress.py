"""Progress on stderr while the dumps are read, matched and diagnosed (rich).

Takes the phases of a run as they begin and the count of files read; draws, on a
terminal only and never with --quiet, the phase's name, a bar with the percentage, the
files read per second and the time left; everything drawn is erased before the report
is written. `Progress.of(enabled=False)` draws nothing and imports nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

# Redrawn at most this often: thousands of files are read per second on a big job.
REDRAW_SECONDS = 0.1


class Progress:
    """Called as `progress(done, total)` by the loader; `phase(name)` names what follows.
    `after_reading` names the phase that begins once every file is read (None: none)."""

    def __init__(self, after_reading: Optional[str] = None) -> None:
        self.after_reading = after_reading
        self._console: Any = None
        self._bar: Any = None
        self._task: Any = None  # the count of files read, while one is drawn
        self._drawn = 0.0

    @classmethod
    def of(cls, enabled: bool, after_reading: Optional[str] = "matching the ranks' entries") -> "Progress":
        return _Drawn(after_reading) if enabled else cls(after_reading)

    def __call__(self, done: int, total: int) -> None:
        """Dump files read so far, of all."""

    def phase(self, name: str) -> None:
        """A phase without a count begins (matching, diagnosing, writing ...)."""

    def clear(self) -> None:
        """Erase what was drawn (before the report is written to stdout)."""


class _Drawn(Progress):
    def _show(self, *columns: Any) -> None:
        # Imported only on a terminal: rich costs some 80 ms to import.
        from rich.console import Console
        from rich.progress import Progress

        self.clear()
        if self._console is None:
            self._console = Console(file=sys.stderr)
        # No refresh thread: the loader forks worker processes, and a thread holding the
        # console's lock while it forks would leave the child a lock nobody releases.
        self._bar = Progress(*columns, console=self._console, transient=True, auto_refresh=False)
        self._bar.start()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._task is not None and done < total and now - self._drawn < REDRAW_SECONDS:
            return
        if self._task is None:
            from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn

            self._show(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                       TextColumn("{task.completed}/{task.total} dumps"), _rate_column(), TextColumn("eta"),
                       TimeRemainingColumn())
            self._task = self._bar.add_task("reading dumps", total=total)
        self._bar.update(self._task, completed=done, total=total)
        self._drawn = now
        if done >= total:
            # What follows the reading (matching thousands of ranks) takes a while too:
            # say so until the next phase.
            if self.after_reading:
                self.phase(self.after_reading)
            else:
                self.clear()
            return
        self._bar.refresh()

    def phase(self, name: str) -> None:
        from rich.progress import TextColumn

        # Nothing counts these phases, and nothing redraws in between: their name alone.
        self._show(TextColumn(name + " ..."))
        self._bar.add_task(name, total=None)
        self._bar.refresh()

    def clear(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._task = None


def _rate_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Files read per second."""

        def render(self, task: Any) -> Text:
            speed: Optional[float] = task.finished_speed or task.speed
            return Text(f"{speed:,.0f}/s" if speed else "")

    return RateColumn()

