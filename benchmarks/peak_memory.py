"""Peak memory of a command's whole process tree, sampled every 50 ms from /proc (Linux).

    python benchmarks/peak_memory.py frtrace DIR --format json --workers 16

Prints the wall time, the peak proportional set size (PSS: a page shared by n processes
counts 1/n in each, so the sum is the memory the tree really holds) and the peak sum of
the processes' RSS (which counts a shared page once per process: forked children that
share their parent's pages inflate it). The command's own output is discarded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def tree(root: int) -> list[int]:
    """`root` and every process under it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def pss_and_rss_kb(pid: int) -> tuple[int, int]:
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1])
    except OSError:
        pass  # gone meanwhile
    return pss, rss


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_pss = peak_rss = 0
    while process.poll() is None:
        sizes = [pss_and_rss_kb(pid) for pid in tree(process.pid)]
        peak_pss = max(peak_pss, sum(pss for pss, _ in sizes))
        peak_rss = max(peak_rss, sum(rss for _, rss in sizes))
        time.sleep(0.05)
    print(f"{time.perf_counter() - started:.2f} s, exit {process.returncode}, peak PSS {peak_pss / 1024:.0f} MB, "
          f"peak RSS sum {peak_rss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
