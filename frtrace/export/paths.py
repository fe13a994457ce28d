"""Decide whether an output path may be written, before any dump is read, and put a
finished file in place without ever clobbering what it must not.

`plan_output` checks everything knowable from the path alone (its format, its
directory, whether something is there, whether it is or looks like a dump in the input
directory), so a bad `-o` fails in a second rather than after an hour of loading.
`write_atomically` writes to a hidden temporary file in the same directory and then
links it into place (without `force`: exactly one of several concurrent runs wins, the
others get an error) or renames it over the old file (with `force`). The temporary file
is removed whatever happens, including an exception raised by a signal handler.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Union

from frtrace.errors import OutputError as OutputError  # raised here, caught by the API's callers (and re-exported)
from frtrace.load.discovery import DUMP_NAME_HINTS, parse_rank_from_name
from frtrace.load.sniff import FileKind, classify_file

DATABASE = "database"
TIMELINE = "timeline"
HTML = "html"
# suffix -> (kind of output, format written); longest suffixes first so .json.gz wins over .gz
FORMATS_BY_SUFFIX = (
    (".json.gz", TIMELINE, "gzip timeline JSON"),
    (".json", TIMELINE, "timeline JSON"),
    (".pkl", DATABASE, "pickle"),
    (".pickle", DATABASE, "pickle"),
    (".sqlite3", DATABASE, "SQLite"),
    (".sqlite", DATABASE, "SQLite"),
    (".db", DATABASE, "SQLite"),
    (".html", HTML, "HTML report"),
    (".htm", HTML, "HTML report"),
)


class OutputTarget(NamedTuple):
    path: Path
    kind: str  # DATABASE, TIMELINE or HTML
    format: str  # as FORMATS_BY_SUFFIX names it: pickle, SQLite, timeline JSON, ...
    force: bool

    @property
    def is_sqlite(self) -> bool:
        return self.format == "SQLite"

    @property
    def compressed(self) -> bool:
        return self.format.startswith("gzip")


def format_for(path: Path, kind: str) -> str:
    """The format `path`'s extension asks for; OutputError when it names none of `kind`'s."""
    name = path.name.lower()
    accepted = [suffix for suffix, suffix_kind, _ in FORMATS_BY_SUFFIX if suffix_kind == kind]
    for suffix, suffix_kind, fmt in FORMATS_BY_SUFFIX:
        if suffix_kind == kind and name.endswith(suffix) and len(name) > len(suffix):
            return fmt
    raise OutputError(f"{path}: unsupported {kind} file type (use {', '.join(sorted(accepted))})")


def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _inside(path: Path, roots: Iterable[Union[str, Path]]) -> Optional[Path]:
    """The input root (a directory, or a file's directory) that `path` lies in, if any."""
    real = os.path.realpath(_parent(path))
    for root in roots:
        if not isinstance(root, Path):  # a URL (as_input keeps those as text): no local file lies in it
            continue
        directory = root if root.is_dir() else _parent(root)
        real_root = os.path.realpath(directory)
        if os.path.commonpath([real, real_root]) == real_root:
            return root
    return None


def looks_like_dump_name(name: str) -> bool:
    """A name of the rank-dump kind (`nccl_trace_rank_0.json`): the loader would take it for one."""
    parsed = parse_rank_from_name(name)
    return parsed is not None and any(hint in parsed[0].lower() for hint in DUMP_NAME_HINTS)


def plan_output(path: Path, kind: str, *, force: bool, input_roots: Sequence[Union[str, Path]] = ()) -> OutputTarget:
    """Check an output path before anything is read; OutputError says what is wrong."""
    path = Path(path)
    _refuse_dump_lookalike(path, input_roots)
    fmt = format_for(path, kind)
    parent = _parent(path)
    if not parent.is_dir():
        raise OutputError(f"{path}: directory {parent} does not exist")
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; give a file name")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: directory {parent} is not writable")
    if os.path.lexists(path) and not force:
        # A dangling symlink is something there too: replacing it needs --force.
        what = "is a symlink" if os.path.islink(path) else "already exists"
        raise OutputError(f"{path}: {what} (add --force to replace it)")
    return OutputTarget(path, kind, fmt, force)


def _refuse_dump_lookalike(path: Path, input_roots: Sequence[Union[str, Path]]) -> None:
    """--force promises never to replace a dump: neither one that is there (in any naming
    family), nor a new file the next run would read as a rank's dump."""
    if os.path.lexists(path) and classify_file(path) is FileKind.DUMP:
        raise OutputError(f"{path}: holds a Flight Recorder dump; refusing to overwrite an input dump file")
    root = _inside(path, input_roots)
    if root is not None and looks_like_dump_name(path.name):
        raise OutputError(f"{path}: named like a rank dump inside the input {root}, where it would be read as one; "
                          "choose another name")


def refuse_input_files(target: OutputTarget, input_files: Iterable[str]) -> None:
    """OutputError when `target` is one of the files that were read (by any name)."""
    real = os.path.realpath(target.path)
    if any(os.path.realpath(p) == real for p in input_files):
        raise OutputError(f"{target.path}: refusing to overwrite an input dump file")


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _link_into_place(tmp: str, path: Path) -> None:
    """Give `tmp` the name `path` only if nothing has it: of several runs, one wins."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OutputError(f"{path}: already exists (written meanwhile by another run?); add --force to replace it") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        # A file system without hard links: claim the name exclusively, then rename over it.
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            raise OutputError(f"{path}: already exists (written meanwhile by another run?); add --force to replace it") from None
        os.replace(tmp, path)


def write_atomically(target: OutputTarget, write: Callable[[str], object]) -> None:
    """Call `write(tmp_path)`, then put the result at `target.path` (see module doc)."""
    path = target.path
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=_parent(path))
    os.close(handle)
    try:
        write(tmp)
        # mkstemp creates 0600; give the output the mode any new file would get.
        os.chmod(tmp, _new_file_mode())
        if target.force:
            os.replace(tmp, path)
        else:
            _link_into_place(tmp, path)
    finally:
        # After a link the temporary name is still there; after a failure or a signal, too.
        if os.path.lexists(tmp):
            os.unlink(tmp)
