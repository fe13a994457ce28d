"""The options several commands share, as decorators, and the types click parses them with.

Takes nothing; gives `input_options`, `report_options` and `run_options` (decorators
that add a set of options to a command), `SizeType` (`512M`, `4G`), `RankRangesType`
and `GroupNamesType`, and `ValuesOption`: an option that takes several values after one
flag, as torchfrtrace's `--selected-ranks 0 1 2`, parsed by click's parser.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, TypeVar

import click

from frtrace.load.layout import MAX_WORLD_SIZE
from frtrace.load.sources import is_url
from frtrace.util import parse_size

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT_SETTINGS = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
    # FRTRACE_WORKERS=8, FRTRACE_FORMAT=json, ...: any option's default, for frtrace
    # and frtrace diff alike (the command line still wins). The variable is named after
    # the option's parameter: options whose parameter is named otherwise than their
    # long flag (--format's fmt) name their variable themselves.
    "auto_envvar_prefix": "FRTRACE",
}


# click's ParamType takes the type it converts to from click 8.4 on; the older ones that
# pyproject allows cannot be subscripted at run time (hence the ignores below).


class SizeType(click.ParamType):  # type: ignore[type-arg]
    """A number of bytes: `100`, `1.5k`, `512M`, `4G`."""

    name = "size"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError:
            self.fail(f"takes a size such as 512M or 4G, not {value!r}", param, ctx)


class RankRangesType(click.ParamType):  # type: ignore[type-arg]
    """Rank numbers and ranges (`0 1`, `0-3,8`) as a tuple of ranges, never expanded."""

    name = "ranks"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> tuple[range, ...]:
        if isinstance(value, tuple):
            return value
        from frtrace.util import parse_rank_ranges

        try:
            return parse_rank_ranges(str(value), MAX_WORLD_SIZE)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class GroupNamesType(click.ParamType):  # type: ignore[type-arg]
    """Process group names or descriptions (`tp dp`, `tp,dp`) as a tuple."""

    name = "groups"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        names = tuple(str(value).replace(",", " ").split())
        for name in names:
            if os.sep in name:
                self.fail(f"takes group names or descriptions; {name!r} looks like a path "
                          "(put the dump directory first, or use -d DIR)", param, ctx)
        if not names:
            self.fail("needs at least one group name or description", param, ctx)
        return names


def _is_path(token: str) -> bool:
    # A dump directory named with digits (a job id, 20251120) that follows the values is
    # the positional argument, as is anything naming an existing path or a URL.
    return is_url(token) or os.sep in token or os.path.lexists(token)


def rank_value(token: str) -> bool:
    """A further value of --selected-ranks: rank numbers and ranges, not a path."""
    return token.replace(",", "").replace("-", "").isdigit() and not _is_path(token)


def group_value(token: str) -> bool:
    """A further value of --pg-filters: a word that is not an option or a path."""
    return not token.startswith("-") and not _is_path(token)


class ValuesOption(click.Option):
    """An option that takes one or more values after its flag (`--selected-ranks 0 1 2`,
    as torchfrtrace's argparse `nargs="+"` does), joined by spaces for its type.

    click's parser takes the first value; the values after it that `accepts` are taken
    from the same parse, up to the first option, path or other word. The hook uses the
    parser object click builds for the command; where a click version lacks it, the
    option takes one value (`--selected-ranks 0,1,2` still works).
    """

    def __init__(self, *args: Any, accepts: Callable[[str], bool], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.accepts = accepts

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        parsed = [getattr(parser, "_long_opt", {}).get(opt) for opt in self.opts]
        for parser_option in {id(p): p for p in parsed if p is not None and hasattr(p, "process")}.values():
            parser_option.process = self._taking_more(parser_option.process)

    def _taking_more(self, process: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def take(value: Any, state: Any) -> None:
            values = [value]
            rest = getattr(state, "rargs", None)
            while isinstance(value, str) and rest and self.accepts(rest[0]):
                values.append(rest.pop(0))
            process(" ".join(values) if len(values) > 1 else value, state)

        return take


def input_options(f: F) -> F:
    """Where the dumps are and how to read them: -p, --workers, --max-file-size."""
    f = click.option("--max-file-size", type=SizeType(), default="2G", show_default=True,
                     help="Refuse dump files larger than this (bytes, or 512M, 4G).")(f)
    f = click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Processes that load dumps in parallel; from 4, a large job's matching and costliest "
                          "rules are shared with forked children too (default: number of cores).")(f)
    f = click.option("-p", "--prefix",
                     help="Dump file name prefix before the rank number (default: inferred, e.g. rank_ or "
                          "nccl_trace_rank_).")(f)
    return f


def report_options(formats: list[str], exit_zero_help: str) -> Callable[[F], F]:
    """The report on stdout: --format, --color, --exit-zero."""
    def add(f: F) -> F:
        f = click.option("--exit-zero", is_flag=True, help=exit_zero_help)(f)
        f = click.option("--color", "--colour", "color", type=click.Choice(["auto", "always", "never"]), default="auto",
                         show_default=True,
                         help="Colour the text report: auto is on a terminal only, off with NO_COLOR set, on with "
                              "FORCE_COLOR set.")(f)
        f = click.option("--format", "fmt", envvar="FRTRACE_FORMAT", type=click.Choice(formats), default=formats[0],
                         show_default=True, help="Report format on stdout.")(f)
        return f
    return add


def run_options(verbose_help: str) -> Callable[[F], F]:
    """What the run says besides the report: -q, -v, --debug."""
    def add(f: F) -> F:
        f = click.option("--debug", is_flag=True, help="Show the Python traceback of an internal error.")(f)
        f = click.option("-v", "--verbose", is_flag=True, help=verbose_help)(f)
        f = click.option("-q", "--quiet", is_flag=True,
                         help="No notes or progress on stderr, only errors (the report and exit code are the same).")(f)
        return f
    return add
