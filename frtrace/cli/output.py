"""Where the command's words go: the report on stdout, notes and errors on stderr.

Takes text; writes it, and says how the run ends (`finish`, `fail`). What one run asked
for (`--quiet`, `--color`) lives in its click context, not in module state, so that
commands run in one process (tests, the API's callers) never see each other's.

A reader of stdout that goes away ends the run with 141, as SIGPIPE ends a Unix tool:
also when the report fitted in the pipe and `| head -1` took only its first line (see
`PipeWatch`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import shutil
import signal
import stat
import struct
import sys
import termios
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, NoReturn, Optional, TextIO

import click

from frtrace.api import EXIT_BY_STATUS, TEXT_WIDTH as DEFAULT_WIDTH
from frtrace.wording import printable

EXIT_HEALTHY, EXIT_FAULTS, EXIT_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
# What a shell reports for a process its signal ended: 128 + the signal number. CI must
# not read Ctrl-C (or a reader that stopped, as `| head` does) as "faults found" (1).
EXIT_SIGINT, EXIT_SIGPIPE, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGPIPE, 128 + signal.SIGTERM
__all__ = ["EXIT_BY_STATUS", "EXIT_FAULTS", "EXIT_HEALTHY", "EXIT_INCONCLUSIVE", "EXIT_INPUT", "EXIT_SIGINT",
           "EXIT_SIGPIPE", "EXIT_SIGTERM"]

COLOR_CHOICES = ("auto", "always", "never")


@dataclass
class RunOutput:
    """What one run of a command asked of its output."""

    quiet: bool = False
    color: str = "auto"  # auto | always | never
    pipe: Optional["PipeWatch"] = field(default=None)


def run_output() -> RunOutput:
    """This run's settings (a fresh default outside a command)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return RunOutput()
    root = ctx.find_root()
    held = root.meta.get("frtrace.output")
    if held is None:
        held = root.meta["frtrace.output"] = RunOutput()
    return held


def configure(quiet: bool, color: str) -> None:
    settings = run_output()
    settings.quiet, settings.color = quiet, color


def wants_color(stream_is_tty: bool, choice: str) -> bool:
    """`--color always|never` decides; with auto, NO_COLOR (https://no-color.org) turns
    colour off, FORCE_COLOR on, and otherwise a terminal has it."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream_is_tty


def _styler() -> Optional[Callable[..., str]]:
    return click.style if wants_color(_isatty(sys.stdout), run_output().color) else None


def _text_width() -> int:
    """Columns for the text report: $COLUMNS when set, else the terminal's, or the report's
    default width when stdout is not one."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if _isatty(sys.stdout) else DEFAULT_WIDTH


def _isatty(stream: Optional[TextIO]) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (ValueError, AttributeError):
        return False


def _emit(text: str) -> None:
    """Write the report to stdout; a reader that stopped or a full disk ends the run clearly."""
    settings = run_output()
    try:
        if settings.pipe is None:
            settings.pipe = PipeWatch.of(sys.stdout)
            first, newline, rest = text.partition("\n")
            if settings.pipe.active and newline and rest:
                # The first line alone, then wait until the reader took it: a reader that
                # wanted only that line (`| head -1`) is gone before the rest is written.
                sys.stdout.write(first + newline)
                sys.stdout.flush()
                settings.pipe.wait_taken()
                text = rest
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head -1`): end quietly with the code a shell gives a
        # tool that SIGPIPE ended, and let nothing try to flush into the pipe again.
        _silence_stdout()
        sys.exit(EXIT_SIGPIPE)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            _fail("no space left on device writing standard output")
        _fail(f"cannot write standard output ({exc.strerror or exc})")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


class PipeWatch:
    """Whether the reader of a pipe took what was written, or went away without it.

    A report that fits in the pipe's buffer is written whole before `| head -1` has read
    a byte: the write succeeds and nothing tells the writer that most of it was never
    read. So on a pipe the first line goes alone, and at the end the run waits (a few
    seconds at most, for a reader that reads nothing yet) until the reader has taken
    everything or closed its end; closed with text unread ends the run with 141.
    """

    WAIT_SECONDS = 3.0

    def __init__(self, fd: Optional[int]):
        self.fd = fd
        self.waited = 0.0

    @classmethod
    def of(cls, stream: TextIO) -> "PipeWatch":
        try:
            fd = stream.fileno()
            return cls(fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None)
        except (OSError, ValueError, AttributeError):
            return cls(None)

    @property
    def active(self) -> bool:
        return self.fd is not None

    def wait_taken(self) -> bool:
        """Wait until the reader took everything or went away; True when it went away
        leaving text unread."""
        if self.fd is None:
            return False
        pause = 0.001
        while self.waited < self.WAIT_SECONDS:
            unread = _unread(self.fd)
            if unread is None or unread == 0:
                return False
            if _reader_gone(self.fd):
                return True
            time.sleep(pause)
            self.waited += pause
            pause = min(pause * 2, 0.05)
        return False


def _unread(fd: int) -> Optional[int]:
    """Bytes written to a pipe and not yet read (None where the platform cannot tell)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return None


def _reader_gone(fd: int) -> bool:
    """A pipe's writing end reports an error once no reader holds the other end."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _settled(code: int) -> int:
    """The exit code, or 141 when the reader of the report went away before taking it all."""
    pipe = run_output().pipe
    if pipe is not None and pipe.active:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            return EXIT_SIGPIPE
        if pipe.wait_taken():
            _silence_stdout()
            return EXIT_SIGPIPE
    return code


def _note(message: str) -> None:
    """One line on stderr, unless --quiet. It may quote dump strings or paths: escaped,
    so a file name cannot drive the terminal or forge a line."""
    if run_output().quiet:
        return
    _say(message)


def _say(message: str) -> None:
    try:
        click.echo(f"frtrace: {printable(message)}", err=True)
    except (OSError, ValueError):  # stderr closed or its reader gone: nowhere left to say it
        pass


def _fail(message: str) -> NoReturn:
    """An error: said even with --quiet; exits 2."""
    _say(f"error: {message}")
    sys.exit(EXIT_INPUT)


def _finish(code: int, verbose: bool, started: float, load_seconds: float) -> NoReturn:
    if verbose:
        total = time.monotonic() - started
        _note(f"{total:.2f}s total ({load_seconds:.2f}s loading and matching)")
    sys.exit(_settled(code))


def _emit_block(lines: Iterable[str]) -> None:
    _emit("".join(line + "\n" for line in lines) + "\n")


def _emit_lines(lines: list[str]) -> None:
    """Write lines in slices: the reader sees the first ones before the last are joined."""
    for start in range(0, len(lines), 256):
        _emit("".join(line + "\n" for line in lines[start:start + 256]))
