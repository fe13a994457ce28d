"""Time the diagnosis alone, several times over one analysis, and print the times on stdout.

    python benchmarks/diagnose_repeat.py DIR [--runs 5] [--label TEXT]

Loads DIR once (two loader processes), builds the layout and matches in this process,
then times `diagnose(analysis, 1)` `--runs` times, each after a full garbage collection.
A diagnosis change is small against a whole run's spread on a noisy machine; its own
time, repeated on one analysis, shows it. Compare two checkouts by running this file with
`python -P` and `PYTHONPATH` set to each in turn, alternating.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from frtrace.diagnosis import diagnose
from frtrace.load.layout import build_layout
from frtrace.load.loader import load_dumps
from frtrace.match.analysis import finish_analysis
from frtrace.match.matcher import DealtDumps, match


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    dealt = DealtDumps()
    loaded = load_dumps([args.directory], None, workers=2, on_dump=dealt.add)
    layout = build_layout(loaded.dumps, loaded.failed_ranks, None)
    analysis = finish_analysis(loaded, layout, match(loaded.dumps, layout, dealt, processes=1))
    seconds = []
    for _ in range(args.runs):
        gc.collect()
        start = time.perf_counter()
        diagnose(analysis, 1)
        seconds.append(round(time.perf_counter() - start, 3))
    print(json.dumps({"label": args.label, "directory": args.directory, "diagnose_seconds": sorted(seconds)}))


if __name__ == "__main__":
    main()
