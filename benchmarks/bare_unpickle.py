"""Lower bound for loading: read and unpickle every dump file in one directory, nothing else.

    python benchmarks/bare_unpickle.py DIR [--processes N]

Prints one JSON object on stdout: files, bytes, entries, seconds. Each dump is dropped as soon
as its entries are counted, so memory stays at one dump. With --processes N, N processes
share the files (every N-th file each, from a fork): the floor for frtrace --workers N.

Plain `pickle.load` is fine here, and only here: the files are our own synthetic dumps written
by `frtrace.testing.synth` for this benchmark, never user input. (frtrace itself reads dumps with an
unpickler that refuses every class lookup; see frtrace/load/safe_decode.py.)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import sys
import time


def _unpickle_all(paths: list) -> tuple:
    """(entries, bytes) of `paths`, each unpickled and dropped."""
    entries = size = 0
    for path in paths:
        with open(path, "rb") as handle:
            dump = pickle.load(handle)  # trusted: our own generated files (see module docstring)
            size += handle.tell()
        entries += len(dump.get("entries") or ())
        del dump
    return entries, size


def main(argv: list) -> int:
    usage = "usage: python benchmarks/bare_unpickle.py DIR [--processes N]"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage + "\n\n" + (__doc__ or "").split("\n\n", 2)[-1])
        return 0
    if len(argv) not in (1, 3) or (len(argv) == 3 and (argv[1] != "--processes" or not argv[2].isdigit())):
        print(usage, file=sys.stderr)
        return 2
    directory, processes = argv[0], int(argv[2]) if len(argv) == 3 else 1
    if not os.path.isdir(directory):
        print(f"bare_unpickle.py: {directory}: not a directory", file=sys.stderr)
        return 2
    paths = sorted(os.path.join(directory, name) for name in os.listdir(directory))
    paths = [p for p in paths if os.path.isfile(p)]
    started = time.perf_counter()
    if processes == 1:
        entries, size = _unpickle_all(paths)
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            parts = pool.map(_unpickle_all, [paths[k::processes] for k in range(processes)])
        entries, size = sum(p[0] for p in parts), sum(p[1] for p in parts)
    seconds = time.perf_counter() - started
    print(json.dumps({"files": len(paths), "bytes": size, "entries": entries, "seconds": seconds,
                      "processes": processes}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
