"""Tell from a file's first bytes what it is: a Flight Recorder dump, one of frtrace's
own outputs, or something else.

Discovery uses it so that unrelated files whose names end in a number (`pg_waldump.1.gz`)
and frtrace's own Database, SQLite and timeline files are never taken for rank dumps;
the output checks use it so that `--force` never replaces a dump. Only a few KiB are
read, without blocking, and only from regular files: nothing here decodes a pickle.
"""

from __future__ import annotations

import enum
import os
import stat
import zlib
from pathlib import Path
from typing import Union

from frtrace.load.safe_decode import _JSON_START, GZIP_MAGIC, PICKLE_PROTO

HEAD_BYTES = 4096
SQLITE_MAGIC = b"SQLite format 3\x00"
# The Database pickle begins with its `types` dict, whose first table names and fields
# are these; a dump's first KiB never holds them (its keys are version, pg_config, ...).
DATABASE_MARKERS = (b"memberships", b"membership_source")
TIMELINE_MARKER = b'"traceEvents"'
# Key names a dump (or its first entry, for the oldest producers' bare lists) shows in its
# first KiB, in a pickle as in JSON. A JSON file or pickle without any is someone else's.
DUMP_MARKERS = (b"pg_config", b"pg_status", b"comm_lib_version", b"nccl_version", b"xccl_version",
                b"record_id", b"profiling_name")


class FileKind(enum.Enum):
    DUMP = "a Flight Recorder dump"
    EMPTY = "an empty file"
    DATABASE = "an frtrace Database pickle"
    SQLITE = "an SQLite database"
    TIMELINE = "an frtrace timeline"
    DATA = "pickle or JSON without a dump's keys"  # a broken dump, or someone else's data
    OTHER = "not a Flight Recorder dump"


# What frtrace itself writes: never an input, and fair game for `--force`.
OWN_OUTPUTS = frozenset({FileKind.DATABASE, FileKind.SQLITE, FileKind.TIMELINE})


def read_head(path: Union[str, Path], size: int = HEAD_BYTES) -> bytes:
    """Up to `size` bytes from the start of a regular file; OSError for anything else
    (a FIFO named like a dump must not block discovery)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        return os.read(fd, size)
    finally:
        os.close(fd)


def _gunzip_head(head: bytes) -> bytes:
    try:
        return zlib.decompressobj(wbits=31).decompress(head, HEAD_BYTES)
    except zlib.error:
        return b""


def classify_head(head: bytes) -> FileKind:
    """The kind of file these first bytes begin (see FileKind)."""
    if head.startswith(GZIP_MAGIC):
        head = _gunzip_head(head)
        if not head:
            return FileKind.OTHER
    if not head:
        return FileKind.EMPTY
    if head.startswith(SQLITE_MAGIC):
        return FileKind.SQLITE
    if head[0] == PICKLE_PROTO and all(marker in head[:1024] for marker in DATABASE_MARKERS):
        return FileKind.DATABASE
    if _JSON_START.match(head) and TIMELINE_MARKER in head[:64]:
        return FileKind.TIMELINE
    if head[0] == PICKLE_PROTO or _JSON_START.match(head):
        return FileKind.DUMP if any(marker in head for marker in DUMP_MARKERS) else FileKind.DATA
    return FileKind.OTHER


def classify_file(path: Union[str, Path]) -> FileKind:
    """The kind of file at `path`; OTHER when it cannot be read (reading it later says why)."""
    try:
        return classify_head(read_head(path))
    except OSError:
        return FileKind.OTHER
