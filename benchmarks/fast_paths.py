#!/usr/bin/env python3
"""Time each fast path of the table and the matcher against its plain twin.

    python benchmarks/fast_paths.py DIR [--rounds N] [--path MODULE:NAME ...] [--whole SECONDS]

Loads DIR once (as `frtrace DIR` does), then, in this one process, runs the work that
follows the load (dealing each dump into its groups, `match`, the device view's
rematch, `diagnose`) once with every fast path and once with each plain twin swapped in
(frtrace.testing.twins), alternating them round after round so that the machine's drift
touches all alike. Prints per variant the median and minimum CPU seconds of a round and
what the fast path saves, as a share of that work and, with --whole (frtrace's end-to-end
seconds on DIR, measured apart), of the whole run: ARCHITECTURE.md asks for 5 % of the
whole run at 1,024 ranks before a fast path lands. Every variant must give the same
report (checked: the JSON report's bytes).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frtrace.diagnosis import diagnose  # noqa: E402
from frtrace.load.layout import build_layout  # noqa: E402
from frtrace.load.loader import load_dumps  # noqa: E402
from frtrace.match.analysis import finish_analysis  # noqa: E402
from frtrace.match.matcher import DealtDumps, match  # noqa: E402
from frtrace.report.render import render_json  # noqa: E402
from frtrace.testing.twins import MODULES, fast_paths, plain_twins  # noqa: E402


def _one_round(loaded, layout) -> tuple[float, str]:
    """CPU seconds of the work after the load, and the JSON report it ends in."""
    gc.collect()
    started = time.process_time()
    dealt = DealtDumps()
    for dump in loaded.dumps:
        dealt.add(dump)
    analysis = finish_analysis(loaded, layout, match(loaded.dumps, layout, dealt))
    diagnosis = diagnose(analysis)
    seconds = time.process_time() - started
    return seconds, render_json(analysis, diagnosis)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/fast_paths.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--path", nargs="+", help="only these fast paths (module:name, see frtrace.testing.twins)")
    parser.add_argument("--whole", type=float, help="frtrace's end-to-end seconds on DIR, measured apart")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    gc.disable()  # as frtrace's command line does
    loaded = load_dumps([args.directory], workers=args.workers)
    layout = build_layout(loaded.dumps, loaded.failed_ranks, None)
    variants = ["fast"] + (args.path or sorted(fast_paths(MODULES)))  # (the loader's are timed apart)
    seconds: dict[str, list[float]] = {variant: [] for variant in variants}
    reports: dict[str, str] = {}
    for _ in range(args.rounds):
        for variant in variants:
            if variant == "fast":
                took, report = _one_round(loaded, layout)
            else:
                with plain_twins([variant]):
                    took, report = _one_round(loaded, layout)
            seconds[variant].append(took)
            reports.setdefault(variant, report)
    fast = statistics.median(seconds["fast"])
    print(f"{len(loaded.dumps)} ranks, {args.rounds} rounds; CPU seconds of deal + match + rematch + diagnose")
    print(f"{'variant':48} {'median':>7} {'min':>7}  {'saved':>7}  {'of that':>7}  {'of whole':>8}  same report")
    for variant in variants:
        median = statistics.median(seconds[variant])
        saved = median - fast
        whole = f"{100 * saved / args.whole:+.1f} %" if args.whole else "-"
        print(f"{variant:48} {median:7.3f} {min(seconds[variant]):7.3f}  {saved:+7.3f}  {100 * saved / fast:+6.1f} %"
              f"  {whole:>8}  {reports[variant] == reports['fast']}")
    return 0 if all(report == reports["fast"] for report in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
