"""Dump files that are not plain local paths: objects in a store (fsspec URLs) and members
of archives (.tar, .tar.gz/.tgz, .zip).

`expand_input` turns one input (a URL of a prefix or an object, or an archive given as a
file or URL) into `Source`s, which discovery treats like files: each has a `name` (the
rank is read from it, as for files), a `parent` (its directory, for generations), an
`mtime`, `head()` (first bytes, for telling dumps from other files) and `read(max_bytes)`.
A Source is small and picklable: loader workers and dask workers read it themselves,
straight from the store or the archive, not through the process that found it.

Archives are untrusted like dumps: nothing is extracted to disk; members are read as
bounded streams with the loader's limits (`--max-file-size`, the gzip ratio of
safe_decode); members named absolutely or with `..`, links, devices and encrypted or
oddly compressed zip members are refused with one line each, never followed. A plain
.tar or a .zip is read member by member in place (a seek and a bounded read, by any
worker); a compressed tarball cannot be entered in the middle, so it is streamed once,
in the process that finds it, and its dump members are held in memory (each at most
`--max-file-size`, the whole stream at most the gzip ratio times the archive).

Inflation is budgeted per input and per run, not per member: every Source knows the
bytes of the input it occupies (`stored`), and may inflate to the gzip ratio times
those, or to its share of one floor (`floor`, divided among the files of a run by the
loader); zip members whose bytes overlap another's (one compressed stream listed two
thousand times) are refused when the archive is listed. Names are kept whole (a rank
is read from the end of a deep path); they are escaped only where they are printed.
A name listed twice (a member appended to a tar, an object reached through `//`) is
read once, the last one, as tar and unzip do, with one note per archive or prefix.

fsspec and the store's package (s3fs, gcsfs) are imported only when a URL is given.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import re
import struct
import tarfile
import zlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Literal, Optional, TypeGuard, Union

from frtrace.load.safe_decode import _GZIP_RATIO_FLOOR, GZIP_MAGIC, MAX_GZIP_RATIO, _one_line, inflation_allowed
from frtrace.util import install_hint, shortened

if TYPE_CHECKING:
    import zipfile

    from _typeshed import WriteableBuffer

HEAD_BYTES = 4096
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
# An archive of a 100,000-rank job holds 100,000 dumps and a few logs; one with millions of
# members is a trap for the listing itself.
MAX_ARCHIVE_MEMBERS = 1_000_000
_URL = re.compile(r"^(?P<protocol>[a-zA-Z][a-zA-Z0-9+.-]*)://")
# The package each store needs, and the frtrace extra that installs it.
EXTRA_OF_PROTOCOL = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
# One input as the loader takes it (see as_input): a URL as text, or a local path.
Input = Union[str, Path]
# A file system of fsspec's (an AbstractFileSystem): fsspec ships no types.
FileSystem = Any
# What a listing says went wrong with an archive as a whole: (archive, problem).
Problem = tuple[str, str]
# Whether a member's base name may be a rank's dump (see discovery).
Wanted = Callable[[str], bool]


class SourceError(Exception):
    """An input cannot be listed or opened at all (one line for the user)."""


def is_url(item: object) -> TypeGuard[str]:
    return isinstance(item, str) and _URL.match(item) is not None


def as_input(item: object) -> Input:
    """A command-line input (read as its text: a str, a Path, ...) as the loader takes it:
    URLs stay strings (a Path would fold `s3://` into `s3:/`), `file://` URLs become local
    paths, everything else a Path."""
    text = str(item)
    match = _URL.match(text)
    if match is None:
        return Path(text)
    if match["protocol"].lower() == "file":
        return Path(text[len("file://"):] or "/")
    return text


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


# --------------------------------------------------------------------------- sources


class Source:
    """A dump file that is not a local path (see the module doc)."""

    __slots__ = ("where", "name", "parent", "mtime", "stored")

    def __init__(self, where: str, name: str, parent: str, mtime: Optional[float], stored: int = 0) -> None:
        self.where, self.name, self.parent, self.mtime = where, name, parent, mtime
        # The bytes of the input this source occupies (0: as many as it reads): what its
        # inflation is measured against (see safe_decode.inflation_allowed).
        self.stored = stored

    def __str__(self) -> str:
        return self.where

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"

    def __lt__(self, other: object) -> bool:
        return str(self) < str(other)

    def __gt__(self, other: object) -> bool:
        return str(self) > str(other)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Source) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(self.where)

    def __getstate__(self) -> tuple[object, ...]:
        return tuple(getattr(self, slot) for cls in type(self).__mro__ for slot in getattr(cls, "__slots__", ()))

    def __setstate__(self, state: Iterable[object]) -> None:
        slots = [slot for cls in type(self).__mro__ for slot in getattr(cls, "__slots__", ())]
        for slot, value in zip(slots, state):
            setattr(self, slot, value)

    def head(self) -> bytes:
        raise NotImplementedError

    def read(self, max_bytes: int, floor: int = _GZIP_RATIO_FLOOR) -> bytes:
        """The bytes, at most `max_bytes` (inflated within the allowance of `stored` and
        `floor`); OSError or ValueError (one line) otherwise."""
        raise NotImplementedError


# A dump file: a local path, or a Source (an object in a store, an archive member).
DumpPath = Union[Path, Source]


class RemoteFile(Source):
    """An object in a store, read through fsspec by whichever process loads it (its
    credentials come from that process's environment and profiles)."""

    __slots__ = ("url", "size")

    def __init__(self, url: str, size: Optional[int], mtime: Optional[float], name: Optional[str] = None) -> None:
        # `name`: the object's path below the bucket as listed, `//` folded (see _list_url)
        name = name if name is not None else url
        super().__init__(url, posixpath.basename(name.rstrip("/")), posixpath.dirname(name.rstrip("/")), mtime,
                         size or 0)
        self.url, self.size = url, size

    def head(self) -> bytes:
        fs, path = _filesystem(self.url)
        return _remote_call(lambda: fs.cat_file(path, start=0, end=HEAD_BYTES), self.url)

    def read(self, max_bytes: int, floor: int = _GZIP_RATIO_FLOOR) -> bytes:
        if self.size is not None and self.size > max_bytes:
            raise ValueError(f"file is {self.size:,} bytes, over the {max_bytes:,}-byte limit (raise --max-file-size)")
        fs, path = _filesystem(self.url)
        # A range of one more byte than allowed: an object grown since it was listed is
        # refused without being fetched whole.
        data = _remote_call(lambda: fs.cat_file(path, start=0, end=max_bytes + 1), self.url)
        if len(data) > max_bytes:
            raise ValueError(f"file is over the {max_bytes:,}-byte limit (raise --max-file-size)")
        return data


class RefusedMember(Source):
    """An archive member that is never read (a link, a `..` name, ...): reading it says why."""

    __slots__ = ("reason", "candidate")

    def __init__(self, archive: str, name: str, reason: str, candidate: bool = False) -> None:
        # `candidate`: still a rank's dump file, one that cannot be read (too large), as a
        # plain file over the limit is; other refused members never stand for a rank.
        super().__init__(_member_where(archive, name), posixpath.basename(name),
                         _member_where(archive, posixpath.dirname(name)), None)
        self.reason, self.candidate = reason, candidate

    def head(self) -> bytes:
        return b""

    def read(self, max_bytes: int, floor: int = _GZIP_RATIO_FLOOR) -> bytes:
        raise ValueError(self.reason)


class RefusedObject(RefusedMember):
    """An object in a store that is never read (its key holds `..`): reading it says why."""

    __slots__ = ()

    def __init__(self, url: str, reason: str) -> None:
        Source.__init__(self, url, posixpath.basename(url), posixpath.dirname(url), None)
        self.reason, self.candidate = reason, False


class TarMember(Source):
    """A regular member of an uncompressed tar: `size` bytes at `offset`, read in place."""

    __slots__ = ("archive", "offset", "size")

    def __init__(self, archive: str, name: str, offset: int, size: int, mtime: Optional[float]) -> None:
        super().__init__(_member_where(archive, name), posixpath.basename(name),
                         _member_where(archive, posixpath.dirname(name)), mtime, size)
        self.archive, self.offset, self.size = archive, offset, size

    def head(self) -> bytes:
        with _open_archive(self.archive) as handle:
            handle.seek(self.offset)
            return handle.read(min(self.size, HEAD_BYTES))

    def read(self, max_bytes: int, floor: int = _GZIP_RATIO_FLOOR) -> bytes:
        if self.size > max_bytes:
            raise ValueError(f"member is {self.size:,} bytes, over the {max_bytes:,}-byte limit (raise --max-file-size)")
        with _open_archive(self.archive) as handle:
            handle.seek(self.offset)
            data = handle.read(self.size)
        if len(data) < self.size:
            raise ValueError("truncated archive: the member ends early")
        return data


class ZipMember(Source):
    """A member of a zip archive: its local header at `offset`, then `compressed` bytes
    stored or deflated, all before `end` (the next member's header, or the central
    directory); inflated with the same allowance as a gzip'd dump of `compressed` bytes."""

    __slots__ = ("archive", "offset", "compressed", "size", "method", "end")

    def __init__(self, archive: str, name: str, offset: int, compressed: int, size: int, method: int,
                 mtime: Optional[float], end: Optional[int] = None) -> None:
        super().__init__(_member_where(archive, name), posixpath.basename(name),
                         _member_where(archive, posixpath.dirname(name)), mtime, compressed)
        self.archive, self.offset, self.compressed, self.size, self.method = archive, offset, compressed, size, method
        self.end = end

    def head(self) -> bytes:
        try:
            with _open_archive(self.archive) as handle:
                raw = self._raw(handle, min(self.compressed, HEAD_BYTES * 4))
            return raw[:HEAD_BYTES] if self.method == 0 else zlib.decompressobj(-15).decompress(raw, HEAD_BYTES)
        except (OSError, ValueError, zlib.error):
            return b""

    def read(self, max_bytes: int, floor: int = _GZIP_RATIO_FLOOR) -> bytes:
        # The sizes in the directory are the archive's word only: the inflated stream is
        # bounded by the limits whatever they say.
        if self.compressed > max_bytes or self.size > max_bytes:
            raise ValueError(f"member is {max(self.size, self.compressed):,} bytes, over the {max_bytes:,}-byte "
                             "limit (raise --max-file-size)")
        with _open_archive(self.archive) as handle:
            raw = self._raw(handle, self.compressed)
        if len(raw) < self.compressed:
            raise ValueError("truncated archive: the member ends early")
        if self.method == 0:
            return raw
        allowed = inflation_allowed(len(raw), max_bytes, floor)
        try:
            inflater = zlib.decompressobj(-15)
            data = inflater.decompress(raw, allowed + 1)
        except zlib.error as exc:
            raise ValueError(f"corrupt deflate data ({_one_line(str(exc))})") from None
        if len(data) > max_bytes:
            raise ValueError(f"decompresses to more than {max_bytes:,} bytes (raise --max-file-size)")
        if len(data) > allowed:
            raise ValueError(f"decompresses to more than {MAX_GZIP_RATIO} times its {len(raw):,} bytes "
                             "(honest dumps inflate at most about 30 times): a zip bomb?")
        return data

    def _raw(self, handle: BinaryIO, count: int) -> bytes:
        handle.seek(self.offset)
        header = handle.read(30)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            raise ValueError("corrupt archive: no member header where the directory says")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = self.offset + 30 + name_length + extra_length
        if self.end is not None and start + self.compressed > self.end:
            # Its data would run into the next member's: the bytes of one stream read twice.
            raise ValueError(_OVERLAP)
        handle.seek(start)
        return handle.read(count)


class HeldMember(Source):
    """A member of a compressed tarball, read while the tarball was streamed once."""

    __slots__ = ("data",)

    def __init__(self, archive: str, name: str, data: bytes, mtime: Optional[float]) -> None:
        # `stored` is set once the whole tarball is streamed: the member's share of its bytes.
        super().__init__(_member_where(archive, name), posixpath.basename(name),
                         _member_where(archive, posixpath.dirname(name)), mtime, len(data))
        self.data = data

    def head(self) -> bytes:
        return self.data[:HEAD_BYTES]

    def read(self, max_bytes: int, floor: int = _GZIP_RATIO_FLOOR) -> bytes:
        if len(self.data) > max_bytes:
            raise ValueError(f"member is {len(self.data):,} bytes, over the {max_bytes:,}-byte limit (raise --max-file-size)")
        return self.data


def _member_where(archive: str, name: str) -> str:
    return f"{archive}:{name}" if name else archive


# --------------------------------------------------------------------------- fsspec


def _fsspec() -> ModuleType:
    try:
        import fsspec
    except ImportError:
        raise SourceError(f"reading URLs needs fsspec: {install_hint('s3', 'gcs')}") from None
    module: ModuleType = fsspec  # untyped: mypy sees Any
    return module


def _protocol(url: str) -> str:
    """The scheme of a URL `is_url` accepted."""
    match = _URL.match(url)
    assert match is not None
    return match["protocol"]


def _filesystem(url: str) -> tuple[FileSystem, str]:
    """`(filesystem, path)` for a URL; SourceError naming the extra when its package is missing."""
    fsspec = _fsspec()
    protocol = _protocol(url).lower()
    try:
        found: tuple[FileSystem, str] = fsspec.core.url_to_fs(url)
        return found
    except ImportError:
        extra = EXTRA_OF_PROTOCOL.get(protocol)
        hint = install_hint(extra) if extra else f"install the fsspec package for {protocol}://"
        raise SourceError(f"reading {protocol}:// URLs needs a package that is not installed: {hint}") from None
    except ValueError as exc:  # an unknown protocol
        raise SourceError(f"{url}: {_one_line(str(exc))}") from None


def _remote_call(call: Callable[[], bytes], url: str) -> bytes:
    try:
        return call()
    except (SourceError, ValueError):
        raise
    except FileNotFoundError:
        raise OSError("no such object") from None
    except Exception as exc:  # stores raise their own types (botocore, google.auth ...)
        raise OSError(_one_line(f"{type(exc).__name__}: {exc}")) from None


def _remote_mtime(info: dict[str, Any]) -> Optional[float]:
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                import datetime
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _list_url(url: str, notes: list[str]) -> list[Source]:
    """The Sources under `url` (a prefix) or of that one object: a RemoteFile per object,
    a RefusedObject per key that names `.` or `..` (a store may resolve those to objects
    outside the prefix). Keys that differ only by repeated slashes (`job//rank_0`, a
    prefix written with `//`) name one object: the last one listed is read, `notes` say so."""
    fs, path = _filesystem(url)
    protocol = _protocol(url)

    def listing() -> dict[str, dict[str, Any]]:  # each object's path -> fsspec's details of it
        if not url.endswith("/") and fs.isfile(path):
            info = fs.info(path)
            return {path: info}
        found: dict[str, dict[str, Any]] = fs.find(path, withdirs=False, detail=True)
        return found

    try:
        found = listing()
    except FileNotFoundError:
        raise SourceError(f"{url}: no such bucket, prefix or object") from None
    except SourceError:
        raise
    except Exception as exc:
        raise SourceError(f"{url}: cannot list ({_one_line(f'{type(exc).__name__}: {exc}')})") from None
    if not found:
        raise SourceError(f"{url}: no such bucket, prefix or object")
    objects: dict[str, RemoteFile] = {}  # the key with `//` folded -> its Source: a later one replaces an earlier
    refused: list[Source] = []
    replaced = []
    for name in sorted(found):
        info = found[name]
        if info.get("type", "file") != "file":
            continue
        full = fs.unstrip_protocol(name) if hasattr(fs, "unstrip_protocol") else f"{protocol}://{name}"
        parts = [part for part in name[len(path.rstrip("/")):].split("/") if part]
        if any(part in (".", "..") for part in parts):
            refused.append(RefusedObject(full, "object key names '.' or '..': not read (a store may resolve it "
                                               "to another object, outside the prefix)"))
            continue
        if any(part.startswith(".") for part in parts):
            continue  # hidden files and directories are skipped, as in a local directory
        size = info.get("size")
        folded = re.sub(r"/+", "/", name)
        if folded in objects:
            replaced.append(folded)
        objects[folded] = RemoteFile(full, size if isinstance(size, int) else None, _remote_mtime(info), folded)
    if replaced:
        notes.append(_duplicates_note(url, "object key", replaced))
    return list(objects.values()) + refused


def _duplicates_note(where: str, what: str, names: list[str]) -> str:
    """One line for the names listed more than once under `where` (an archive or prefix)."""
    shown = ", ".join(shortened(name, 200) for name in sorted(set(names))[:3])
    more = " ..." if len(set(names)) > 3 else ""
    count = len(set(names))
    return (f"{where}: {count} {what}{'s' if count > 1 else ''} listed more than once ({shown}{more}): "
            f"the last of each is read")


def _open_archive(archive: str) -> BinaryIO:
    """A binary file object over the archive (a local path or a URL), seekable."""
    if is_url(archive):
        fs, path = _filesystem(archive)
        try:
            handle: BinaryIO = fs.open(path, "rb")
            return handle
        except Exception as exc:
            raise OSError(_one_line(f"{type(exc).__name__}: {exc}")) from None
    return open(archive, "rb")


# --------------------------------------------------------------------------- archives


def _member_problem(name: str) -> Optional[str]:
    """Why a member's name must not be read, or None."""
    if "\x00" in name:
        return "member name holds a NUL byte"
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute member name: refused (nothing outside the archive is read)"
    if ".." in re.split(r"[/\\]", name):
        return "member name leaves the archive (..): refused"
    return None


def _quoted_name(name: str) -> str:
    """A name shortened and escaped for a message (never for finding a rank)."""
    return _one_line(name, 120)


class _LastOfEachName:
    """Members by name as an archive lists them: a later member of a name replaces the
    earlier one (tar and unzip leave the last one in place), and the names seen twice
    are remembered for one note."""

    def __init__(self) -> None:
        self.members: dict[str, Optional[Source]] = {}  # None: a name that is no file to read
        self.replaced: list[str] = []

    def add(self, name: str, member: Optional[Source]) -> None:
        if name in self.members:
            self.replaced.append(name)
            del self.members[name]  # the replacement takes the later place
        self.members[name] = member

    def result(self, archive: str, notes: list[str]) -> list[Source]:
        if self.replaced:
            notes.append(_duplicates_note(archive, "member name", self.replaced))
        return [member for member in self.members.values() if member is not None]


def _tar_members(archive: str, handle: BinaryIO, refused: list[Problem], notes: list[str]) -> list[Source]:
    members = _LastOfEachName()
    tar = tarfile.open(fileobj=handle, mode="r:")
    count = 0
    for info in tar:
        count += 1
        if count > MAX_ARCHIVE_MEMBERS:
            refused.append((archive, f"holds more than {MAX_ARCHIVE_MEMBERS:,} members: the rest are not read"))
            break
        source = _checked_tar_member(archive, info)
        members.add(info.name, source if not isinstance(source, bool) else
                    TarMember(archive, info.name, info.offset_data, info.size, _tar_mtime(info)))
    return members.result(archive, notes)


def _tar_mtime(info: tarfile.TarInfo) -> Optional[float]:
    # A pax header may say any number (-1e300, inf, nan): discovery judges whether it is a time.
    try:
        return float(info.mtime)
    except (TypeError, ValueError, OverflowError):
        return None


def _checked_tar_member(archive: str, info: tarfile.TarInfo) -> Union[None, RefusedMember, Literal[True]]:
    """None for a directory (nothing to read), a RefusedMember, or True for a regular file."""
    name = info.name
    problem = _member_problem(name)
    if problem:
        return RefusedMember(archive, name, problem)
    if info.isdir():
        return None
    if info.issym():
        return RefusedMember(archive, name, f"symbolic link to {_quoted_name(info.linkname)!r}: links are not followed")
    if info.islnk():
        return RefusedMember(archive, name, f"hard link to {_quoted_name(info.linkname)!r}: links are not followed")
    if not info.isreg():
        return RefusedMember(archive, name, "not a regular file (a device, FIFO or other special member)")
    return True


def _stream_compressed_tar(archive: str, handle: BinaryIO, size: Optional[int], max_bytes: int, wanted: Wanted,
                           refused: list[Problem], notes: list[str], floor: int) -> list[Source]:
    """Stream a gzip'd tarball once: held members for names `wanted(name)` accepts. The
    whole stream inflates within the allowance of the archive's `size` and `floor`."""
    limit = inflation_allowed(size, None, floor) if size else None
    stream = _BoundedStream(gzip.GzipFile(fileobj=handle), limit)
    members = _LastOfEachName()
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for count, info in enumerate(tar, 1):
                if count > MAX_ARCHIVE_MEMBERS:
                    refused.append((archive, f"holds more than {MAX_ARCHIVE_MEMBERS:,} members: the rest are not read"))
                    break
                checked = _checked_tar_member(archive, info)
                name = info.name
                if not isinstance(checked, bool):
                    members.add(name, checked)
                    continue
                if not wanted(posixpath.basename(name)):
                    members.add(name, None)  # a later member of the name still replaces a wanted one
                    continue
                if info.size > max_bytes:
                    members.add(name, RefusedMember(archive, name, f"member is {info.size:,} bytes, over the "
                                                    f"{max_bytes:,}-byte limit (raise --max-file-size)", candidate=True))
                    continue
                reader = tar.extractfile(info)
                data = reader.read(info.size) if reader is not None else b""
                members.add(name, HeldMember(archive, name, data, _tar_mtime(info)))
    except _TooMuch:
        refused.append((archive, f"decompresses to more than {MAX_GZIP_RATIO} times its {size:,} bytes: a gzip "
                                 "bomb? (members after that point are not read)"))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        refused.append((archive, f"corrupt or truncated archive ({_one_line(str(exc) or type(exc).__name__)}); "
                                 "members after that point are not read"))
    held = members.result(archive, notes)
    for member in held:
        if isinstance(member, HeldMember) and size and stream.done:
            # Its share of the compressed bytes: what a gzip'd dump inside may inflate against.
            member.stored = max(1, len(member.data) * size // stream.done)
    return held


class _TooMuch(Exception):
    pass


class _BoundedStream(io.RawIOBase):
    """A read-only stream that stops with _TooMuch past `limit` bytes."""

    def __init__(self, inner: gzip.GzipFile, limit: Optional[int]) -> None:
        self.inner, self.limit, self.done = inner, limit, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.done += len(data)
        if self.limit is not None and self.done > self.limit:
            raise _TooMuch()
        return data

    def readinto(self, buffer: WriteableBuffer) -> int:
        target = memoryview(buffer).cast("B")
        data = self.read(len(target))
        target[: len(data)] = data
        return len(data)


_OVERLAP = ("its bytes overlap another member's (the same compressed data listed twice: a zip bomb?): refused")


def _zip_spans(infos: list[zipfile.ZipInfo], directory_start: int) -> tuple[dict[int, int], set[int]]:
    """`(end, overlapping)`: for each member (by index), the offset its bytes must end
    before (the next member's header, or the central directory), and the indexes of the
    members whose bytes reach into another member's or the directory. A member takes at
    least its local header (30 bytes and its name) and its compressed data."""
    order = sorted(range(len(infos)), key=lambda i: infos[i].header_offset)
    end: dict[int, int] = {}
    overlapping: set[int] = set()
    for position, index in enumerate(order):
        info = infos[index]
        following = infos[order[position + 1]].header_offset if position + 1 < len(order) else directory_start
        end[index] = following
        if info.header_offset + 30 + _encoded_length(info) + info.compress_size > following:
            overlapping.add(index)
            if position + 1 < len(order):
                overlapping.add(order[position + 1])
    return end, overlapping


def _encoded_length(info: zipfile.ZipInfo) -> int:
    try:
        return len(info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"))
    except (UnicodeEncodeError, AttributeError):
        return len(info.filename.encode("utf-8", "surrogateescape"))


def _zip_members(archive: str, handle: BinaryIO, refused: list[Problem], notes: list[str]) -> list[Source]:
    import zipfile

    try:
        listing = zipfile.ZipFile(handle)
        infos = listing.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise SourceError(f"{archive}: not a readable zip archive ({_one_line(str(exc))})") from None
    if len(infos) > MAX_ARCHIVE_MEMBERS:
        refused.append((archive, f"holds more than {MAX_ARCHIVE_MEMBERS:,} members: the rest are not read"))
        infos = infos[:MAX_ARCHIVE_MEMBERS]
    end, overlapping = _zip_spans(infos, listing.start_dir)
    members = _LastOfEachName()  # ZipMember, or RefusedMember for what is never read
    for index, info in enumerate(infos):
        name = info.filename
        problem = _member_problem(name)
        if problem:
            members.add(name, RefusedMember(archive, name, problem))
            continue
        if info.is_dir():
            members.add(name, None)
            continue
        mode = info.external_attr >> 16
        if info.create_system == 3 and mode and (mode & 0o170000) not in (0, 0o100000):
            kind = "symbolic link" if (mode & 0o170000) == 0o120000 else "special file"
            members.add(name, RefusedMember(archive, name, f"{kind} member: links are not followed"))
        elif info.flag_bits & 0x1:
            members.add(name, RefusedMember(archive, name, "encrypted member: refused"))
        elif info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            members.add(name, RefusedMember(archive, name, f"member compressed with method {info.compress_type} "
                                                           "(only stored and deflate are read)"))
        elif index in overlapping:
            # Not a candidate for its rank: what it holds cannot be told, and it must not
            # stand beside (or against) an honest member of the same rank.
            members.add(name, RefusedMember(archive, name, _OVERLAP))
        else:
            import calendar
            try:
                mtime: Optional[float] = float(calendar.timegm(info.date_time + (0, 0, 0)))
            except (ValueError, OverflowError):
                mtime = None
            members.add(name, ZipMember(archive, name, info.header_offset, info.compress_size, info.file_size,
                                        info.compress_type, mtime, end[index]))
    return members.result(archive, notes)


def _archive_kind(head: bytes) -> Optional[str]:
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def expand_archive(archive: str, max_bytes: int, wanted: Wanted, refused: list[Problem],
                   notes: Optional[list[str]] = None, floor: int = _GZIP_RATIO_FLOOR) -> list[Source]:
    """The members of an archive (a local path or a URL) as Sources. Refused members are
    Sources whose read says why; problems with the archive as a whole go to `refused` as
    `(archive, problem)`, names listed twice to `notes`; SourceError when it cannot be
    opened at all. A compressed tarball inflates within `floor` or the gzip ratio."""
    notes = [] if notes is None else notes
    try:
        handle = _open_archive(archive)
    except (OSError, SourceError) as exc:
        raise SourceError(f"{archive}: cannot open ({_one_line(str(exc))})") from None
    with handle:
        try:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(0)
            kind = _archive_kind(handle.read(512))
            handle.seek(0)
        except OSError as exc:
            raise SourceError(f"{archive}: cannot read ({_one_line(str(exc))})") from None
        if kind == "zip":
            return _zip_members(archive, handle, refused, notes)
        if kind == "tar.gz":
            return _stream_compressed_tar(archive, handle, size, max_bytes, wanted, refused, notes, floor)
        if kind == "tar":
            try:
                return _tar_members(archive, handle, refused, notes)
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise SourceError(f"{archive}: not a readable tar archive ({_one_line(str(exc))})") from None
    raise SourceError(f"{archive}: not a tar, tar.gz or zip archive")


def expand_input(item: Input, max_bytes: int, wanted: Wanted, refused: list[Problem],
                 notes: Optional[list[str]] = None, floor: int = _GZIP_RATIO_FLOOR) -> list[Source]:
    """The Sources of one input that is a URL or an archive (see `needs_expanding`)."""
    notes = [] if notes is None else notes
    if is_url(item):
        if is_archive_name(item):
            return expand_archive(item, max_bytes, wanted, refused, notes, floor)
        return _list_url(item, notes)
    return expand_archive(str(item), max_bytes, wanted, refused, notes, floor)


def needs_expanding(item: Input) -> bool:
    """Whether an input is read through this module: a URL, or an archive file."""
    if is_url(item):
        return True
    return isinstance(item, Path) and is_archive_name(item.name) and item.is_file()
