"""Lines that fit a width: wrapped prose and tables whose cells wrap.

Takes lines of text (already escaped) or a table's headers and rows, and a width in
columns; returns lines none of which is wider than that. Prose wraps at spaces, with
continuation lines indented under the text they continue (after a `- ` bullet, or a
`label: ` of an indented detail); a word longer than the width is cut. Pure functions.
"""

from __future__ import annotations

import re
import textwrap
from typing import Optional, Protocol, Sequence

from tabulate import tabulate

# Below this the report would be one word a line: narrower terminals get this width.
MIN_WIDTH = 40
# Between two columns of a table (tabulate's "simple" format).
COLUMN_GAP = 2
# A column is never squeezed narrower than this (or its widest cell, if narrower), nor
# than its longest word up to LONGEST_UNBROKEN characters (an op name, `12-14 ms`).
MIN_COLUMN = 10
LONGEST_UNBROKEN = 24

# The first cell of a row that stands for a blank line (tabulate drops rows of blanks). Cells
# are escaped text (wording.printable), which never holds NUL.
_ROW_BREAK = "\x00"
# Where a continuation line starts: under the text after a leading `- ` bullet.
_BULLET = re.compile(r"^( *)(- )")


class Style(Protocol):
    """What colours a line for a terminal (click.style): `fg` names a colour."""

    def __call__(self, text: str, *, fg: Optional[str] = None, bold: Optional[bool] = None) -> str: ...


def fit_width(width: Optional[int]) -> Optional[int]:
    """The width to lay text out in: None (no limit), else at least MIN_WIDTH."""
    return None if width is None else max(width, MIN_WIDTH)


def wrap_line(line: str, width: Optional[int], hanging: Optional[int] = None) -> list[str]:
    """`line` as lines of at most `width` columns; continuation lines are indented like
    the line, plus 2 under a `- ` bullet, or by `hanging` when given. Spaces inside the
    text are kept as they are."""
    width = fit_width(width)
    if width is None or len(line) <= width:
        return [line]
    stripped = line.lstrip(" ")
    indent = len(line) - len(stripped)
    if hanging is None:
        bullet = _BULLET.match(line)
        hanging = len(bullet.group(0)) if bullet else indent + 2
    hanging = min(hanging, width // 2)
    wrapper = _Wrapper(width=width, initial_indent=" " * indent, subsequent_indent=" " * hanging)
    return wrapper.wrap(stripped) or [line[:width]]


class _Wrapper(textwrap.TextWrapper):
    """Breaks at spaces and after the commas of a list (`0-3,8,12-15`, never inside a
    range such as `193-197`); a word longer than the width is cut."""

    wordsep_re = re.compile(r"(\s+|(?<=,)(?=[^\s,]))")

    def __init__(self, width: int, initial_indent: str = "", subsequent_indent: str = "") -> None:
        # break_on_hyphens selects wordsep_re (above), which never breaks at a hyphen.
        super().__init__(width=width, initial_indent=initial_indent, subsequent_indent=subsequent_indent,
                         break_long_words=True, break_on_hyphens=True, drop_whitespace=True, replace_whitespace=False)


def _wrap_cell(text: str, width: int) -> str:
    return "\n".join(_Wrapper(width=width).wrap(text)) if len(text) > width else text


def wrap_lines(lines: Sequence[str], width: Optional[int]) -> list[str]:
    """Every line wrapped (see wrap_line)."""
    out: list[str] = []
    for line in lines:
        out.extend(wrap_line(line, width))
    return out


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[str]], width: Optional[int], indent: int = 2) -> list[str]:
    """A "simple" table indented by `indent`, as tabulate writes it when it fits; else its
    widest columns wrap (rows then set apart by a blank line), and where even columns of
    MIN_COLUMN do not fit, one block per row (`header: value` lines)."""
    width = fit_width(width)
    pad = " " * indent
    table = _tabulate(headers, rows, None)
    if width is None or all(len(pad + line) <= width for line in table):
        return [pad + line for line in table]
    available = width - indent - COLUMN_GAP * (len(headers) - 1)
    for _attempt in range(8):  # tabulate may pad a wrapped header past its width: squeeze again
        widths = _squeezed_widths(headers, rows, available)
        if widths is None:
            break
        lines = ["" if line.strip() == _ROW_BREAK else (pad + line).rstrip()
                 for line in _tabulate(headers, _spaced(rows, headers, widths), widths)]
        overflow = max(len(line) for line in lines) - width
        if overflow <= 0:
            return lines
        available -= overflow
    return _row_blocks(headers, rows, width, indent)


def _tabulate(headers: Sequence[str], rows: Sequence[Sequence[str]], widths: Optional[list[int]]) -> list[str]:
    if widths is not None:  # wrapped here rather than by tabulate: lists break after their commas
        headers = [_wrap_cell(h, w) for h, w in zip(headers, widths)]
        rows = [[_wrap_cell(str(cell), w) for cell, w in zip(row, widths)] for row in rows]
    text: str = tabulate([list(row) for row in rows], headers=list(headers), tablefmt="simple", disable_numparse=True)
    return text.splitlines()


def _natural_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    # tabulate pads a header by 2 (its MIN_PADDING)
    return [max([len(header) + 2] + [len(str(row[i])) for row in rows]) for i, header in enumerate(headers)]


def _squeezed_widths(headers: Sequence[str], rows: Sequence[Sequence[str]], available: int) -> Optional[list[int]]:
    """Column widths summing to at most `available`: each column keeps its floor (see
    MIN_COLUMN) and a share of the rest in proportion to what it would
    take beyond it; None when the floors alone do not fit."""
    natural = _natural_widths(headers, rows)
    floors = [min(width, max(MIN_COLUMN, _longest_word(header), *(min(_longest_word(str(row[i])), LONGEST_UNBROKEN)
                                                                    for row in rows)))
              if any(str(row[i]) for row in rows) else width  # an empty column keeps its header whole
              for i, (width, header) in enumerate(zip(natural, headers))]
    spare = available - sum(floors)
    if spare < 0:
        return None
    wanted = [n - f for n, f in zip(natural, floors)]
    if sum(wanted) <= spare:
        return natural
    return [f + want * spare // sum(wanted) for f, want in zip(floors, wanted)]


def _longest_word(text: str) -> int:
    """The longest piece `_Wrapper` never breaks (between spaces, or after a comma)."""
    return max((len(word) for word in _Wrapper.wordsep_re.split(text) if word and not word.isspace()), default=0)


def _spaced(rows: Sequence[Sequence[str]], headers: Sequence[str], widths: list[int]) -> list[list[str]]:
    """The rows with an empty row between two when any cell wraps: which lines make one row stays clear."""
    wraps = any(len(str(cell)) > width for row in rows for cell, width in zip(row, widths))
    if not wraps:
        return [list(row) for row in rows]
    spaced: list[list[str]] = []
    for i, row in enumerate(rows):
        if i:
            spaced.append([_ROW_BREAK] + [""] * (len(headers) - 1))
        spaced.append(list(row))
    return spaced


def _row_blocks(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, indent: int) -> list[str]:
    """One block per row: its first cell, then `header: value` for every other non-empty cell."""
    pad = " " * indent
    lines: list[str] = []
    for row in rows:
        lines += wrap_line(f"{pad}{headers[0]} {row[0]}", width, indent + 2)
        for header, cell in zip(headers[1:], row[1:]):
            if cell:
                lines += wrap_line(f"{pad}  {header}: {cell}", width, indent + 4)
    return lines
