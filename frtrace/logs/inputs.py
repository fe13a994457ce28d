"""Which files are logs, and what their paths say about whose they are.

Takes paths (log files, directories of per-rank or per-node logs); returns `LogSource`s
in a stable order, each with the rank its name gives (`rank_3.log`, `.../rank3/...`), a
torchelastic log directory's local rank (`attempt_0/3/stderr.log`), and a host when a
name looks like one (`node02.log`, `node02_rank_5.log`). A log is any regular file whose
first KiB read as text (plain or compressed) and that is not a Flight Recorder dump or
one of frtrace's own outputs.
"""

from __future__ import annotations

import bz2
import lzma
import os
import re
import zlib
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

from frtrace.load.sniff import FileKind, classify_head, read_head
from frtrace.load.sources import ARCHIVE_SUFFIXES

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)
_ATTEMPT_DIR = re.compile(r"attempt_(\d+)$")
_HOSTISH = re.compile(r"^(?:node|host|nid|gpu|worker|compute|cn|dgx|hgx)[-_.]?[\w.-]*\d[\w.-]*$", re.IGNORECASE)
_GENERIC_STEMS = frozenset({"log", "logs", "train", "training", "output", "out", "stdout", "stderr", "slurm", "job",
                            "run", "error", "err", "console", "main"})
_SUFFIXES = (".gz", ".bz2", ".xz", ".log", ".txt", ".out", ".err")
_ZIP_MAGIC = b"PK\x03\x04"
# Enough of a file's start that is printable to call it text (binary noise may follow).
_TEXT_SHARE = 0.75


class LogSource(NamedTuple):
    path: str
    rank: Optional[int]  # the global rank the path names
    local_rank: Optional[int]  # a torchelastic log directory's local rank
    host: Optional[str]


class LogInputError(Exception):
    """A log input cannot be used at all (one line for the user)."""


def is_log_file(path: Path) -> bool:
    if str(path).lower().endswith(ARCHIVE_SUFFIXES):
        return False  # an archive of dumps (or of anything): the loader's
    try:
        head = read_head(path)
    except OSError:
        return False
    return looks_like_text_log(head)


def looks_like_text_log(head: bytes) -> bool:
    kind = classify_head(head)
    if kind is FileKind.EMPTY:
        return True
    if kind not in (FileKind.OTHER, FileKind.DATA):
        return False
    if head.startswith(_ZIP_MAGIC) or head[257:262] == b"ustar":
        return False
    text = _decompressed_head(head)
    if text[257:262] == b"ustar":
        return False  # a compressed tarball
    if kind is FileKind.DATA and (text[:1] == b"\x80" or _is_json_line(text)):
        return False  # a pickle or JSON document that is no dump: not a log either
    if not text:
        return False
    sample = text[:1024].decode("utf-8", "replace")
    printable = sum(1 for ch in sample if ch.isprintable() or ch in "\n\r\t\x1b")
    return printable >= _TEXT_SHARE * len(sample)


_JSON_SCALAR = re.compile(rb'-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|"(?:[^"\\]|\\.)*"')


def _is_json_line(text: bytes) -> bool:
    """Whether the file's first line reads as a JSON value of its own (never parsed: it is
    untrusted). Log lines that begin with `[rank0]:` or `[2024-03-21 ...]` do not end in a
    bracket; a first line longer than the head is a JSON document's."""
    if b"\n" not in text and len(text) >= 4096:
        return True
    first = text.split(b"\n", 1)[0].strip()
    if first in (b"{", b"[") or _JSON_SCALAR.fullmatch(first):
        return True
    return first[:1] in (b"{", b"[") and first[-1:] in (b"}", b"]")


def _decompressed_head(head: bytes) -> bytes:
    try:
        if head.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(wbits=31).decompress(head, 4096)
        if head.startswith(b"BZh"):
            return bz2.BZ2Decompressor().decompress(head)[:4096]
        if head.startswith(b"\xfd7zXZ\x00"):
            return lzma.LZMADecompressor().decompress(head, 4096)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError):
        return b""
    return head


def has_log_files(directory: Path) -> bool:
    return any(True for _ in _log_files_under(directory, limit=1))


def discover_logs(paths: Iterable[Path]) -> list[LogSource]:
    """Every log file under `paths` (files given by name are taken even when empty)."""
    found: list[LogSource] = []
    seen: set[str] = set()
    for path in paths:
        path = Path(path)
        if path.is_dir():
            files = sorted(_log_files_under(path), key=_natural)
        elif path.is_file():
            if not is_log_file(path):
                raise LogInputError(f"{path}: not a text log (a dump, a database or binary data)")
            files = [path]
        else:
            raise LogInputError(f"{path}: no such file or directory")
        for file in files:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                found.append(source_of(file, path if path.is_dir() else file.parent))
    return found


def _log_files_under(directory: Path, limit: Optional[int] = None) -> Iterable[Path]:
    count = 0
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            if path.is_file() and not path.is_symlink() and is_log_file(path):
                yield path
                count += 1
                if limit is not None and count >= limit:
                    return


def _natural(path: Path) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def source_of(path: Path, root: Path) -> LogSource:
    """What the path says about whose log it is."""
    stem = _stem(path.name)
    rank = _rank_in(stem)
    try:
        parts = path.relative_to(root).parts[:-1]
    except ValueError:
        parts = ()
    for part in reversed(parts):
        if rank is None:
            rank = _rank_in(part)
    local = None
    parent = path.parent
    if parent.name.isdigit() and _ATTEMPT_DIR.search(parent.parent.name):
        local = int(parent.name)  # torchelastic: <log_dir>/<run>/attempt_N/<local_rank>/stderr.log
    return LogSource(str(path), rank, local, _host_in(stem, parts))


def _stem(name: str) -> str:
    for suffix in _SUFFIXES * 2:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _rank_in(text: str) -> Optional[int]:
    match = _RANK_IN_NAME.search(text)
    return int(match.group(1)) if match else None


_HOST_AFTER_RANK = re.compile(r"rank[_-]([A-Za-z][\w.-]*?)[_-]\d+$", re.IGNORECASE)


def _host_in(stem: str, parts: tuple[str, ...]) -> Optional[str]:
    after = _HOST_AFTER_RANK.search(stem)  # nccl_trace_rank_node02_5
    if after and _HOSTISH.match(after.group(1)):
        return after.group(1)
    before_rank = re.split(r"[_.-]rank", stem, flags=re.IGNORECASE)[0]
    for candidate in (before_rank, *reversed(parts)):
        candidate = candidate.strip("_.-")
        if candidate and candidate.lower() not in _GENERIC_STEMS and _HOSTISH.match(candidate):
            return candidate
    return None
