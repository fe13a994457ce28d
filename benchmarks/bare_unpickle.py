"""Lower bound for loading: read and unpickle every dump file in one directory, nothing else.

    python benchmarks/bare_unpickle.py DIR

Prints one JSON object on stdout: files, bytes, entries, seconds. Each dump is dropped as soon
as its entries are counted, so memory stays at one dump.

Plain `pickle.load` is fine here, and only here: the files are our own synthetic dumps written
by `frtrace.testing.synth` for this benchmark, never user input. (frtrace itself reads dumps with an
unpickler that refuses every class lookup; see frtrace/safe_decode.py.)
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/bare_unpickle.py DIR", file=sys.stderr)
        return 2
    directory = argv[0]
    paths = sorted(os.path.join(directory, name) for name in os.listdir(directory))
    paths = [p for p in paths if os.path.isfile(p)]
    started = time.perf_counter()
    entries = 0
    size = 0
    for path in paths:
        with open(path, "rb") as handle:
            dump = pickle.load(handle)  # trusted: our own generated files (see module docstring)
            size += handle.tell()
        entries += len(dump.get("entries") or ())
        del dump
    seconds = time.perf_counter() - started
    print(json.dumps({"files": len(paths), "bytes": size, "entries": entries, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
