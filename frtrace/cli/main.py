"""The `frtrace` entry point: a click group whose default command is the analysis.

Takes the command line; `frtrace [OPTIONS] [DIR]...` runs the analysis (cli/analyse.py,
`-j` in cli/raw.py) and `frtrace diff OLD NEW` the comparison (cli/diff.py). Ends the
process with the command's exit code; Ctrl-C, SIGTERM and internal errors become one
line on stderr and 130, 143 or 2.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any, NoReturn, Optional, Union

import click

from frtrace.cli.analyse import frtrace
from frtrace.cli.diff import frtrace_diff
from frtrace.cli.output import EXIT_HEALTHY, EXIT_INPUT, EXIT_SIGINT, _note

# The name the default command runs under inside the group. Not a command a user can
# name: `frtrace analyse` reads a dump directory called analyse, as before.
DEFAULT_COMMAND = "\0analyse"


class AnalysisFirstGroup(click.Group):
    """`frtrace diff ...` runs the subcommand; anything else (`frtrace DIR`, `frtrace -j`,
    `frtrace --help`) the default command, with every option of the analysis. A dump
    directory named like a subcommand is reached as `./diff`."""

    def __init__(self, *args: Any, default: click.Command, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.default = default

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name == DEFAULT_COMMAND:
            return self.default
        return super().get_command(ctx, cmd_name)


class _DefaultContext(click.Context):
    """The default command's context: its path is the program's (`frtrace [OPTIONS]`,
    `Try 'frtrace -h'`), not `frtrace <name>`."""

    @property
    def command_path(self) -> str:
        if self.info_name == DEFAULT_COMMAND and self.parent is not None:
            return self.parent.command_path
        return super().command_path


frtrace.context_class = _DefaultContext

cli = AnalysisFirstGroup(
    name="frtrace", default=frtrace, commands={"diff": frtrace_diff}, add_help_option=False,
    help="Find the rank, process group and collective behind a hung PyTorch job from its Flight Recorder dumps.",
)


def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point; internal errors become one line unless --debug is given.
    Ends the process (see _exit_now)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["diff"] and os.path.isdir("diff"):
        _note("note: `frtrace diff` compares two dump sets; for the dump directory named diff, run frtrace ./diff")
    # One short-lived run that builds millions of small objects with no reference cycles:
    # the cyclic collector would rescan them all, again and again, for nothing (a third of
    # the run time at 512 ranks). Reference counting still frees everything.
    gc.disable()
    _handle_stop_signals()
    try:
        cli.main(args=args, prog_name="frtrace", standalone_mode=True)
    except (Interrupted, KeyboardInterrupt) as stop:
        # Temporary output files are gone by now: the signal unwound through their cleanup.
        code = stop.code if isinstance(stop, Interrupted) else EXIT_SIGINT
        _note("interrupted" if code == EXIT_SIGINT else "terminated")
        _exit_now(code)
    except SystemExit as done:
        # Exit from in here: leaving this block drops the exception's traceback, whose
        # frames hold the whole analysis, and freeing that takes seconds (12 s after a
        # 16,384-rank run) for a process that is ending anyway.
        _exit_now(done.code)
    except Exception as exc:  # a bug of ours: say so in one line, full detail on request
        if "--debug" in args:
            traceback.print_exc()
        else:
            _note(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
        _exit_now(EXIT_INPUT)
    _exit_now(EXIT_HEALTHY)


class Interrupted(BaseException):
    """SIGINT, SIGTERM or another stop signal (see stop_signals) arrived. A BaseException, so that click does not turn it into
    "Aborted!" and exit 1, and every `finally` on the way out (temporary files) runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.code = 128 + signum


def _on_stop_signal(main_pid: int, signum: int, frame: Optional[FrameType]) -> None:
    if os.getpid() != main_pid:
        # A forked loader worker (Ctrl-C reaches the whole process group): the main
        # process does the reporting; a worker just ends, without a traceback.
        os._exit(128 + signum)
    raise Interrupted(signum)


# Every signal whose default action ends the process and that another process (a shell,
# a scheduler, a terminal hanging up) sends: each unwinds like SIGTERM, so temporary
# output files are removed. SIGPIPE stays ignored (a closed reader is handled where the
# write fails); the faults a process raises on itself (SIGSEGV, SIGBUS, ...) cannot be
# handled in Python.
_STOP_SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGABRT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                      "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGPWR", "SIGIO", "SIGSTKFLT")


def stop_signals() -> tuple[int, ...]:
    """The signals `main` turns into a clean exit with 128 + their number, on this platform."""
    found = {getattr(signal, name) for name in _STOP_SIGNAL_NAMES if hasattr(signal, name)}
    if hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX"):
        found.update(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    return tuple(sorted(found))


def _handle_stop_signals() -> None:
    handler = functools.partial(_on_stop_signal, os.getpid())
    for signum in stop_signals():
        try:
            signal.signal(signum, handler)
        except (OSError, ValueError):  # reserved on this platform (a real-time signal libc keeps)
            continue


def _exit_now(code: Union[int, str, None]) -> NoReturn:
    # Tearing the interpreter down frees every object one by one: 15 s after a
    # 16,384-rank run, for a process that is ending anyway. Outputs are closed by now.
    if code is not None and not isinstance(code, int):
        click.echo(str(code), err=True)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None when the process started with it closed
                stream.flush()
        except (OSError, ValueError):  # a closed pipe (`frtrace ... | head`) or stream
            pass
    os._exit(code or 0)
