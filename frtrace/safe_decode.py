"""Turn the bytes of one dump file into plain Python data, without trusting them.

Takes bytes (pickle, JSON, or gzip of either) and returns dicts, lists, tuples, str,
int, float, bool and None. A Flight Recorder dump never holds anything else, so the
unpickler refuses every class lookup and persistent id: a hostile file cannot make
frtrace import or call anything.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import zlib

GZIP_MAGIC = b"\x1f\x8b"
PICKLE_PROTO = 0x80


class DecodeError(ValueError):
    """The bytes are not a readable dump; the message says why in a few words."""


class _PlainDataUnpickler(pickle.Unpickler):
    # GLOBAL, STACK_GLOBAL, INST, OBJ, NEWOBJ(_EX), REDUCE and EXT1/2/4 all need a
    # callable, and the only way to obtain one is find_class; refusing it here
    # refuses them all. BUILD on a plain container fails on its own.
    def find_class(self, module: str, name: str):
        raise DecodeError(f"refused: the pickle asks for {module}.{name} (dumps never contain classes)")

    def persistent_load(self, pid):
        raise DecodeError("refused: the pickle uses persistent ids (dumps never do)")


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            out = stream.read(max_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise DecodeError(f"corrupt gzip data ({exc})") from None
    if len(out) > max_bytes:
        raise DecodeError(f"decompresses to more than {max_bytes:,} bytes (raise --max-file-size)")
    return out


def _unpickle(data: bytes):
    try:
        return _PlainDataUnpickler(io.BytesIO(data)).load()
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("pickle nested too deeply") from None
    except MemoryError:
        raise DecodeError("pickle too large to hold in memory") from None
    except Exception as exc:  # the C unpickler raises many types on corrupt input
        reason = str(exc) or type(exc).__name__
        raise DecodeError(f"truncated or corrupt pickle ({reason})") from None


def _parse_json(data: bytes):
    try:
        return json.loads(data)
    except RecursionError:
        raise DecodeError("JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise DecodeError("JSON is not valid UTF-8") from None
    except ValueError as exc:
        raise DecodeError(f"invalid JSON ({exc})") from None


def decode_dump_bytes(data: bytes, max_bytes: int) -> tuple:
    """Return `(data, encoding)` where encoding is pickle, json, pickle+gzip or json+gzip."""
    compressed = data[:2] == GZIP_MAGIC
    if compressed:
        data = _gunzip(data, max_bytes)
    suffix = "+gzip" if compressed else ""
    if not data:
        raise DecodeError("empty file" if not compressed else "empty after gunzip")
    if data[0] == PICKLE_PROTO:
        return _unpickle(data), "pickle" + suffix
    if data.lstrip()[:1] in (b"{", b"["):
        return _parse_json(data), "json" + suffix
    raise DecodeError("not a Flight Recorder dump (neither pickle, JSON nor gzip)")
