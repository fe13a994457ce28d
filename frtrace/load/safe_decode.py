"""Turn the bytes of one dump file into plain Python data, without trusting them.

Takes bytes (pickle, JSON, or gzip of either) and returns dicts, lists, tuples, str,
int, float, bool and None. A Flight Recorder dump never holds anything else, so the
unpickler refuses every class lookup and persistent id: a hostile file cannot make
frtrace import or call anything. Error messages quote the file only escaped and cut
short, so they stay one harmless line on a terminal.
"""

from __future__ import annotations

import contextlib
import copyreg
import gzip
import io
import json
import pickle
import re
import threading
import zlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, NoReturn, Optional

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

resource: Optional[ModuleType]
try:
    import resource
except ImportError:  # Windows: decoding then runs without an address-space cap
    resource = None

GZIP_MAGIC = b"\x1f\x8b"
PICKLE_PROTO = 0x80
# An optional UTF-8 byte-order mark, the whitespace bytes.lstrip() would skip, then `{` or `[`.
_JSON_START = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\n\r\x0b\x0c]*[{\[]")
_MAX_QUOTED_CHARS = 60
_MAX_REASON_CHARS = 160
# Decoded dumps take about 10x their pickled size (measured on synthetic NCCL and the Gloo
# fixtures); 100x plus a floor for small files leaves ample room for any honest pickle.
_SPACE_PER_PICKLE_BYTE = 100
_SPACE_FLOOR = 64 * 1024**2
# Gzip'd dumps inflate about 4x (pickle) to 30x (JSON without stacks), measured on
# synthetic NCCL dumps and the Gloo fixtures; deflate can reach 1,000x, so a 2 MB bomb
# under --max-file-size (a limit on the inflated size) could take 4 GB to decode. Past
# this ratio, and past the floor that keeps small files free of it, a file is refused.
# The floor is one per run: the loader divides it among the files (see loader._jobs), so
# two thousand small bombs cannot each take 64 MB.
MAX_GZIP_RATIO = 100
_GZIP_RATIO_FLOOR = 64 * 1024**2


def inflation_allowed(stored: int, max_bytes: Optional[int], floor: int = _GZIP_RATIO_FLOOR) -> int:
    """How many bytes data kept in `stored` bytes of the input may inflate to: the gzip
    ratio times `stored`, or `floor` where that is more (small files), at most `max_bytes`."""
    allowed = max(floor, MAX_GZIP_RATIO * stored)
    return allowed if max_bytes is None else min(max_bytes, allowed)


# Hashing a tuple recurses in C once per level of tuples nested in tuples, with no
# recursion check: a tuple key nested a million deep (1 KB gzip'd) overflows the C stack
# while the unpickler builds the dict, and the process dies of SIGSEGV. Each level takes
# one tuple-building opcode (TUPLE, TUPLE1/2/3), so a pickle holding fewer of their bytes
# than this cannot nest deeper. A level took 40-80 bytes of stack here (1e5 levels hash in
# an 8 MB main-thread stack, 2e5 crash): 30,000 levels stay under 2.4 MB. Honest dumps
# have about two such bytes per entry (3,800 in 2,000 entries), so buffers of up to some
# 15,000 entries decode in place; a pickle with more is decoded in a separate process
# (see loader.load_one), where a crash costs that one file (20,000 entries: +0.15 s).
SAFE_TUPLE_OPCODES = 30_000
_TUPLE_OPCODES = b"t\x85\x86\x87"
_ALL_BUT_TUPLE_OPCODES = bytes(sorted(set(range(256)) - set(_TUPLE_OPCODES)))


# A value of a decoded dump, and a dump's top-level dict: plain data (see above), but
# untrusted, so what it holds is known only once checked. Any rather than object: the
# normaliser's fast path reads values on the line that checks them (see normalise._fast_entry).
RawValue = Any
RawDump = dict[str, RawValue]


class DecodeError(ValueError):
    """The bytes are not a readable dump; the message says why in a few words."""


class MayNestTooDeeply(DecodeError):
    """The pickle could nest tuples deep enough to crash this process: decode it in another."""


def may_nest_too_deeply(data: bytes) -> bool:
    """Whether `data` (a pickle) holds more tuple-building opcode bytes than can be hashed
    safely. A byte count, in C: it also counts bytes inside strings and numbers, which
    only errs on the safe side."""
    # One pass that keeps only those bytes: a count per opcode byte took 2.5 times longer.
    return len(data.translate(None, _ALL_BUT_TUPLE_OPCODES)) > SAFE_TUPLE_OPCODES


def _one_line(text: str, limit: int = _MAX_REASON_CHARS) -> str:
    # Text taken from a file (or from an exception that quotes it) may hold newlines and
    # terminal escape sequences: escaped, they can neither forge output lines nor drive a terminal.
    shown = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[: limit + 1])
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _quoted(text: str) -> str:
    shown = repr(str(text)[: _MAX_QUOTED_CHARS + 1])  # repr escapes every unprintable character
    return shown if len(shown) <= _MAX_QUOTED_CHARS + 2 else shown[:_MAX_QUOTED_CHARS] + "..."


def _reason(exc: BaseException) -> str:
    return _one_line(str(exc) or type(exc).__name__)


class _PlainDataUnpickler(pickle.Unpickler):
    # GLOBAL, STACK_GLOBAL, INST, OBJ, NEWOBJ(_EX) and REDUCE all need a callable, and the only
    # way to obtain one is find_class (EXT1/2/4 too, once copyreg's cache is empty: see
    # _unpickle); refusing it here refuses them all. BUILD on a plain container fails on its own.
    def find_class(self, module: str, name: str) -> NoReturn:
        wanted = f"{str(module)[:_MAX_QUOTED_CHARS]}.{str(name)[:_MAX_QUOTED_CHARS]}"
        raise DecodeError(f"refused: the pickle asks for {_quoted(wanted)} (dumps never contain classes)")

    def persistent_load(self, pid: object) -> NoReturn:
        raise DecodeError("refused: the pickle uses persistent ids (dumps never do)")


class _WholeInput:
    """A read-only file over bytes already in memory, for the unpickler.

    The C unpickler asks a file with peek() for what lies ahead and decodes from that
    buffer until it runs out. Handing it the whole rest at once makes it decode as fast as
    `pickle.loads` (a BytesIO, read once per opcode, is three times slower; a
    BufferedReader, refilled block by block, a third slower)."""

    __slots__ = ("_data", "_view", "_at")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._view = memoryview(data)
        self._at = 0

    def peek(self, size: int = 0) -> memoryview:
        return self._view[self._at:]

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(len(self._view), self._at + size)
        chunk = self._view[self._at:end].tobytes()
        self._at = end
        return chunk

    def readinto(self, buffer: WriteableBuffer) -> int:
        target = memoryview(buffer).cast("B")
        size = min(len(target), len(self._view) - self._at)
        target[:size] = self._view[self._at:self._at + size]
        self._at += size
        return size

    def readline(self) -> bytes:
        end = self._data.find(b"\n", self._at)
        return self.read(-1 if end < 0 else end + 1 - self._at)


def _gunzip(data: bytes, max_bytes: int, floor: int, stored: int) -> bytes:
    allowed = inflation_allowed(stored, max_bytes, floor)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            out = stream.read(allowed + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise DecodeError(f"corrupt gzip data ({_reason(exc)})") from None
    if len(out) > max_bytes:
        raise DecodeError(f"decompresses to more than {max_bytes:,} bytes (raise --max-file-size)")
    if len(out) > allowed:
        raise DecodeError(f"decompresses to more than {MAX_GZIP_RATIO} times its {stored:,} bytes "
                          f"(honest dumps inflate at most about 30 times): a gzip bomb?")
    return out


def _address_space_in_use() -> Optional[int]:
    if resource is None:
        return None
    try:
        with open("/proc/self/statm", "rb") as statm:
            page_size: int = resource.getpagesize()  # typed here: a ModuleType attribute is Any
            return int(statm.read().split()[0]) * page_size
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _address_space_cap(pickle_size: int) -> Iterator[Optional[int]]:
    """Lower the soft RLIMIT_AS to what is in use plus a budget proportional to the pickle,
    for the duration of the block; yields the budget in bytes, or None when no cap was set."""
    # The C unpickler sizes its memo by the largest index a PUT names and zero-fills it: a
    # 9-byte pickle can demand gigabytes, and it cannot be hooked. Under the cap that
    # allocation fails at once as MemoryError; honest pickles never come near it. The limit
    # is process-wide, so it is only set when no other thread could be allocating.
    if resource is None or not hasattr(resource, "RLIMIT_AS") or threading.active_count() > 1:
        yield None
        return
    in_use = _address_space_in_use()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    budget = max(_SPACE_FLOOR, _SPACE_PER_PICKLE_BYTE * pickle_size)
    if in_use is None or (soft != resource.RLIM_INFINITY and soft <= in_use + budget):
        yield None
        return
    try:
        resource.setrlimit(resource.RLIMIT_AS, (in_use + budget, hard))
    except (ValueError, OSError):
        yield None
        return
    try:
        yield budget
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _stray_stderr_dropped() -> Iterator[None]:
    # When the bytearray of a BYTEARRAY8 cannot be allocated (an absurd length, or one over
    # the cap), CPython (seen in 3.10-3.13) frees it with an uninitialised export count and
    # may print "SystemError: deallocated bytearray object has exported buffers" to sys.stderr:
    # a second, alarming line for one corrupt file. Nothing useful is written there during an
    # unpickle. Swapping sys.stderr is process-wide, so it is only done when no other thread
    # could be writing.
    if threading.active_count() > 1:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def _unpickle(data: bytes) -> object:
    # The C unpickler serves EXT1/2/4 codes from copyreg's cache without calling find_class,
    # so one earlier unpickle of a registered code anywhere in the process would hand this
    # file that callable. Emptying the cache (it only saves lookups) sends them to find_class.
    copyreg.clear_extension_cache()
    with _stray_stderr_dropped(), _address_space_cap(len(data)) as budget:
        try:
            return _PlainDataUnpickler(_WholeInput(data)).load()
        except DecodeError:
            raise
        except RecursionError:
            raise DecodeError("pickle nested too deeply") from None
        except MemoryError:
            raise DecodeError(_out_of_space_reason(len(data), budget)) from None
        except Exception as exc:  # the C unpickler raises many types on corrupt input
            raise DecodeError(f"truncated or corrupt pickle ({_reason(exc)})") from None


def _out_of_space_reason(pickle_size: int, budget: Optional[int]) -> str:
    if budget is None:
        return "pickle too large to hold in memory"
    return (f"truncated or corrupt pickle (decoding would take over {budget // 1024**2:,} MB: "
            f"a length or memo index far beyond its {pickle_size:,} bytes)")


def _parse_json(data: bytes) -> object:
    try:
        return json.loads(data)
    except RecursionError:
        raise DecodeError("JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise DecodeError("JSON is not valid UTF-8") from None
    except ValueError as exc:
        raise DecodeError(f"invalid JSON ({_reason(exc)})") from None


def decode_dump_bytes(data: bytes, max_bytes: int, *, isolated: bool = False, floor: int = _GZIP_RATIO_FLOOR,
                      stored: Optional[int] = None) -> tuple[object, str]:
    """Return `(data, encoding)` where encoding is pickle, json, pickle+gzip or json+gzip.

    Gzip'd data inflates within `inflation_allowed(stored, max_bytes, floor)`, `stored`
    being the bytes of the input the data came from (by default its own length; less for
    an archive member that was inflated already). Raises MayNestTooDeeply for a pickle
    that could crash the process, unless `isolated` says this process may crash for it."""
    return decode_dump(data, max_bytes, isolated=isolated, floor=floor, stored=stored)[:2]


class Decoded(NamedTuple):
    raw: object  # the plain data
    encoding: str  # pickle, json, pickle+gzip or json+gzip
    # The pickle's own bytes (after gunzip), which bound how much a pickle can honestly
    # hold (see normalise: entries per byte); None for JSON, whose every value is written out.
    pickle_bytes: Optional[int]


def decode_dump(data: bytes, max_bytes: int, *, isolated: bool = False, floor: int = _GZIP_RATIO_FLOOR,
                stored: Optional[int] = None) -> Decoded:
    """`decode_dump_bytes`, also saying how many bytes a pickle took."""
    compressed = data[:2] == GZIP_MAGIC
    if compressed:
        data = _gunzip(data, max_bytes, floor, len(data) if stored is None else stored)
    suffix = "+gzip" if compressed else ""
    if not data:
        raise DecodeError("empty file" if not compressed else "empty after gunzip")
    if data[0] == PICKLE_PROTO:
        if not isolated and may_nest_too_deeply(data):
            raise MayNestTooDeeply("may nest tuples too deeply to decode in this process")
        return Decoded(_unpickle(data), "pickle" + suffix, len(data))
    if _JSON_START.match(data):
        return Decoded(_parse_json(data), "json" + suffix, None)
    raise DecodeError("not a Flight Recorder dump (neither pickle, JSON nor gzip)")
