"""How a group, a rank list, an op and a call site are written, in every output.

Takes model records (groups, entries, frames) or their parts; returns short strings.
Text, markdown, JSON messages, SQLite and the timeline all spell these the same way
because they all call here.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from frtrace.model import Entry, Frame
from frtrace.util import fold_ranks


def group_label(name: str, desc: str) -> str:
    """`NAME (desc)`, or `NAME` when the group has no description."""
    return f"{name} ({desc})" if desc else name


def group_text(name: str, desc: str) -> str:
    """`group NAME (desc)`: a group inside a sentence."""
    return f"group {group_label(name, desc)}"


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3`, or `ranks 0-11,13-15`."""
    ordered = tuple(ranks)
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {fold_ranks(ordered)}"


def some_ranks_text(ranks: Iterable[int], most: int = 8) -> str:
    """`ranks_text`, or past `most` ranks their count and the first few: `57 ranks (4,7,15,…)`
    (a sentence read at thousands of ranks stays a line; the evidence lists them all)."""
    ordered = sorted(ranks)
    if len(ordered) <= most:
        return ranks_text(ordered)
    return f"{len(ordered)} ranks ({fold_ranks(ordered[:most])},…)"


def seq_text(entry: Entry) -> str:
    """`#4` for a collective, `p2p #7` for a send or recv."""
    return f"p2p #{entry.p2p_seq_id}" if entry.is_p2p else f"#{entry.collective_seq_id}"


def op_text(entry: Entry) -> str:
    """`all_reduce #4 in group 0 (default_pg)`."""
    return f"{entry.op} {seq_text(entry)} in {group_text(entry.pg_name, entry.pg_desc)}"


def shape_text(entry: Entry) -> str:
    """`all_reduce [[16]] Float`: the op with its input sizes and dtypes."""
    sizes = [list(s) for s in entry.shapes.input_sizes]
    dtypes = sorted(set(entry.shapes.input_dtypes) | set(entry.shapes.output_dtypes))
    return f"{entry.op} {sizes} {'/'.join(dtypes)}".rstrip()


# Where a frame's code comes from, as far as its path tells. The user's call site is the
# innermost frame of their own code: torch, the standard library (contextlib's
# `__exit__` of a coalescing manager, functools wrappers) and `<frozen ...>` pseudo-files
# are never it; installed packages (site-packages) are only when nothing else is there.
USER, INSTALLED, STANDARD_LIBRARY, FRAMEWORK, PSEUDO = "user", "site-packages", "standard library", "torch", "pseudo-file"
_INSTALLED_PATH = re.compile(r"/(?:site|dist)-packages/")
# .../lib/python3.11/contextlib.py, .../lib64/python3.10/..., C:/Python311/Lib/contextlib.py
_STANDARD_LIBRARY_PATH = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/|/Lib/", re.IGNORECASE)
# The order a frame is preferred in when no user frame is there (lower first).
_FALLBACK_ORDER = (INSTALLED, STANDARD_LIBRARY)


def frame_origin(frame: Frame) -> str:
    """Whose code a frame is: USER, INSTALLED, STANDARD_LIBRARY, FRAMEWORK or PSEUDO."""
    path = frame.filename.replace("\\", "/")
    if path.startswith("<"):
        return PSEUDO
    if "/torch/" in path or path.startswith("torch/"):
        return FRAMEWORK
    if _INSTALLED_PATH.search(path):
        return INSTALLED
    if _STANDARD_LIBRARY_PATH.search(path):
        return STANDARD_LIBRARY
    return USER


def call_frame(frames: tuple[Frame, ...]) -> tuple[Optional[Frame], tuple[Frame, ...]]:
    """(the user's call site, the frames skipped above it, innermost first). The innermost
    frame of the user's own code; with none, the innermost installed package's frame, then
    the standard library's; with none of those either, the outermost frame."""
    if not frames:
        return None, ()
    fallback: dict[str, int] = {}
    for index, frame in enumerate(frames):  # stops at the user's frame: most stacks have 2 of torch first
        origin = frame_origin(frame)
        if origin == USER:
            return frame, tuple(frames[:index])
        fallback.setdefault(origin, index)
    for wanted in _FALLBACK_ORDER:
        if wanted in fallback:
            index = fallback[wanted]
            return frames[index], tuple(frames[:index])
    return frames[-1], tuple(frames[:-1])


def user_frame(entry: Optional[Entry]) -> Optional[Frame]:
    """Where the user's code made the entry's call (see call_frame), if the dump says."""
    if entry is None or not entry.frames:
        return None
    return call_frame(entry.frames)[0]


def skipped_frames_text(entry: Optional[Entry]) -> Optional[str]:
    """`distributed_c10d.py:2806 in all_reduce (torch), contextlib.py:144 in __exit__
    (standard library)`: the frames passed over to reach the entry's call site (`-v`)."""
    if entry is None or not entry.frames:
        return None
    skipped = call_frame(entry.frames)[1]
    if not skipped:
        return None
    return ", ".join(f"{_basename(f.filename)}:{f.line} in {f.name} ({frame_origin(f)})" for f in skipped)


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def frame_text(frame: Optional[Frame]) -> Optional[str]:
    return f"{frame.filename}:{frame.line} in {frame.name}" if frame else None


def call_site(entry: Optional[Entry]) -> Optional[str]:
    """`train.py:278 in step`: where the user's code issued the entry's op, if the dump says."""
    return frame_text(user_frame(entry))


def printable(text: str) -> str:
    """`text` safe to print on a terminal: every character that is not printable (C0 and
    C1 controls such as ESC, CR and newline, DEL, line and paragraph separators, bidi
    overrides) is written as a Python-style escape (`\\x1b`, `\\n`, `\\u202e`), so a
    dump's strings can neither drive the terminal nor forge lines. Backslashes are left
    alone; printable text comes back as the same object."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def json_printable(text: str) -> str:
    """JSON text (as `json.dumps(..., ensure_ascii=False)` writes it) with every character
    `printable` would escape written as a JSON `\\uXXXX` escape instead: it reads back
    as the same data, and nothing raw reaches a terminal or a viewer. Newlines between
    values are kept."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char == "\n" else _json_escape(char) for char in text)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a surrogate pair, as JSON spells characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def seq_label(collective_seq_id: Optional[int], p2p_seq_id: Optional[int]) -> str:
    """`#4` for a collective, `p2p #7` for a send or recv (from the two numbers)."""
    return f"p2p #{p2p_seq_id}" if collective_seq_id is None else f"#{collective_seq_id}"


def groups_text(names: Iterable[str], desc: str, most_ranges: Optional[int] = None) -> str:
    """`group 5 (tp)`, `groups 1-4 (tp)` (numeric names fold like ranks), `groups a, b (tp)`,
    or `12 groups (tp)`: the groups a folded row of ranks is in. With `most_ranges`, numeric
    names that fold into more ranges than that are counted instead."""
    names = tuple(names)
    if len(names) == 1:
        return group_text(names[0], desc)
    suffix = f" ({desc})" if desc else ""
    if all(n.isascii() and n.isdigit() for n in names):
        folded = fold_ranks(int(n) for n in names)
        if most_ranges is not None and folded.count(",") >= most_ranges:
            return f"{len(names)} groups{suffix}"
        return f"groups {folded}{suffix}"
    if len(names) <= 3:
        return f"groups {', '.join(names)}{suffix}"
    return f"{len(names)} groups{suffix}"


def duration_text(ns: int) -> str:
    """`0.6 ms`, `350 ms`, `12.3 s`, `4.2 min`, `1.5 h`."""
    if ns < 10_000_000:
        return f"{ns / 1e6:.1f} ms"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.0f} ms"
    seconds = ns / 1e9
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def span_text(low_ns: int, high_ns: int) -> str:
    """`12.3 s`, or `1.0 s-4.2 s` for a range."""
    low, high = duration_text(low_ns), duration_text(high_ns)
    if low == high:
        return low
    (low_number, low_unit), (_, high_unit) = low.split(" "), high.split(" ")
    return f"{low_number}-{high}" if low_unit == high_unit else f"{low}-{high}"
