"""Read a log file as a stream and hand over only the lines worth parsing.

Takes a path (plain, gzip, bzip2 or xz, told apart by their first bytes); yields
`(line number, text)` for each line that holds something the grammar reads, found by a
search over blocks of several MiB in C, so a log of many GiB of training chatter is read
at close to disk speed in memory bounded by the block size. Also tells which global
rank labels (`[rankN]:`) the file holds at all, and whether its last line was cut off.

Lines are decoded leniently (binary noise becomes U+FFFD), carriage returns end a line
(a progress bar redrawn with `\\r` does not hide the log line written after it), a line
longer than `MAX_LINE` is read around its marker only, and ANSI colour is removed.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import zlib
from dataclasses import dataclass, field
from typing import Iterator

from frtrace.logs.grammar import strip_ansi

BLOCK = 8 << 20
MAX_LINE = 64 << 10
# Any of these in a line makes it worth parsing; a line without one says nothing the
# grammar reads. Each is looked for with bytes.find, whose skips make long needles cheap:
# torch's c10 lines name their source file (ProcessGroupNCCL.cpp), NCCL's carry ` NCCL `,
# Python's end in an exception name (c10's own `terminate called ... DistBackendError'`
# too), torchelastic's agent restarts its `worker group`.
NEEDLES = (b"ProcessGroup", b" NCCL ", b"Error", b"Exception", b"Traceback (most", b"worker group", b"global_world_sizes")
# torchrun's failure summary pads its field names; looked for only from the block where
# the summary begins (`ChildFailedError`), as it comes at the end.
SUMMARY_START = (b"ChildFailedError", b"Root Cause")
SUMMARY_NEEDLES = (b"exitcode  :", b"host      :", b"rank      :", b"time      :", b"Root Cause")
_GLOBAL_LABEL = re.compile(rb"\[rank(\d{1,7})\]:")
_MAGIC = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))


@dataclass(slots=True)
class StreamStats:
    bytes_read: int = 0
    lines: int = 0
    partial_last_line: bool = False
    labels: set[int] = field(default_factory=set)  # global rank labels seen anywhere in the file
    damaged: str = ""  # why reading stopped early (a truncated or corrupt compressed stream)
    in_summary: bool = False  # torchrun's failure summary has begun: look for its fields too
    wrap_width: int = -1  # the width a terminal wrapped the lines at (0: none; -1: not told yet)


def open_log(path: str) -> io.BufferedIOBase:
    with open(path, "rb") as probe:
        head = probe.read(6)
    for magic, opener in _MAGIC:
        if head.startswith(magic):
            return opener(path, "rb")
    return open(path, "rb")


def read_marked_lines(path: str, stats: StreamStats, block_size: int = BLOCK) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of every line with a marker, in file order."""
    with open_log(path) as stream:
        carry = b""
        line_base = 0
        while True:
            try:
                chunk = stream.read(block_size)
            except (EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
                stats.damaged = f"{type(exc).__name__}: {exc}"
                chunk = b""
            if not chunk:
                break
            stats.bytes_read += len(chunk)
            data = carry + chunk
            cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
            if cut < 0:
                if len(data) < MAX_LINE:
                    carry = data
                    continue
                cut = len(data) - 1  # one endless line: read it in pieces
            block, carry = data[:cut + 1], data[cut + 1:]
            yield from _scan(block, line_base, stats)
            line_base = stats.lines
        if carry:
            stats.partial_last_line = True
            for number, text in _scan(carry + b"\n", line_base, stats):
                yield number, _without_cut_token(text)


def _scan(block: bytes, line_base: int, stats: StreamStats) -> Iterator[tuple[int, str]]:
    if b"\r" in block:
        block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if stats.wrap_width < 0:
        stats.wrap_width = wrap_width(block)
    stats.labels.update(map(int, set(_GLOBAL_LABEL.findall(block))))
    counted_to, counted = 0, line_base
    if not stats.in_summary and any(mark in block for mark in SUMMARY_START):
        stats.in_summary = True
    for start, hit in _marked_lines(block, NEEDLES + SUMMARY_NEEDLES if stats.in_summary else NEEDLES):
        end = block.find(b"\n", start)
        if end < 0:
            end = len(block)
        counted += block.count(b"\n", counted_to, start)
        counted_to = start
        if end - start > MAX_LINE:  # read a window around the needle, not the whole line
            start = max(start, hit - MAX_LINE // 8)
            end = min(end, start + MAX_LINE)
            raw = block[start:end]
        else:
            raw = _with_wrapped_rest(block, start, end, stats.wrap_width)
        yield counted + 1, strip_ansi(raw.decode("utf-8", "replace"))
    stats.lines = line_base + block.count(b"\n")


# A terminal (or a paste) that wrapped long lines at its width leaves lines of exactly
# that width, none longer, the rest of each on the next line (mid-word, mid-number:
# `... WorkNC` / `CL(SeqNum=1580, ...`). Told from the file's first block.
MIN_WRAP, MAX_WRAP, WRAPPED_LINES = 60, 400, 3


# How a line of its own begins: a bracket, a digit, indentation, NCCL's host:pid:tid, a
# traceback or exception, a logging level. The rest of a wrapped line mostly does not.
_LINE_START = re.compile(rb"$|[\[(\d\s]|[\w.-]+:\d+:\d+ \[|Traceback|terminate|frame #|[A-Z][\w.]*(?:Error|Exception|Warning)"
                         rb"|(?:INFO|WARNING|ERROR|DEBUG)\b")


def wrap_width(block: bytes) -> int:
    """The width the block's lines were wrapped at, or 0: many lines of exactly the widest
    length, and what follows them mostly no line start of its own (the widest lines of an
    unwrapped log are a template's, followed by lines of their own)."""
    lines = block.split(b"\n", 50_000)[:50_000]
    lengths = [len(line) for line in lines]
    widest = max(lengths, default=0)
    if not (MIN_WRAP <= widest <= MAX_WRAP) or lengths.count(widest) < max(WRAPPED_LINES, len(lengths) // 100):
        return 0
    followers = [lines[i + 1] for i, length in enumerate(lengths[:-1]) if length == widest]
    resumed = sum(1 for line in followers if not _LINE_START.match(line))
    return widest if resumed * 10 >= len(followers) * 3 else 0


def _with_wrapped_rest(block: bytes, start: int, end: int, width: int) -> bytes:
    """The line, with the lines that continue it when it was wrapped at `width` (at most
    eight more)."""
    pieces = [block[start:end]]
    for _ in range(8):
        if not width or end - start != width or end >= len(block):
            break
        following = block.find(b"\n", end + 1)
        if following < 0:
            following = len(block)
        pieces.append(block[end + 1:following])
        start, end = end + 1, following
    return b"".join(pieces)


def _marked_lines(block: bytes, needles: tuple[bytes, ...]) -> list[tuple[int, int]]:
    """(line start, first needle in it) of each line holding a needle, in order."""
    hits: dict[int, int] = {}
    find, rfind = block.find, block.rfind
    for needle in needles:
        pos = find(needle)
        while pos >= 0:
            start = rfind(b"\n", 0, pos) + 1
            if hits.get(start, pos + 1) > pos:
                hits[start] = pos
            end = find(b"\n", pos)
            if end < 0:
                break
            pos = find(needle, end)
    return sorted(hits.items())


def _without_cut_token(text: str) -> str:
    """A line cut off mid-write may end in half a number (`work: 15` of `1579`): drop
    whatever follows its last separator."""
    cut = max(text.rfind(mark) for mark in (" ", ",", ".", ")", "]"))
    return text[:cut + 1] if cut >= 0 else ""
