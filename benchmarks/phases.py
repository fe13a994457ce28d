"""Time each stage of the frtrace pipeline on one dump directory and print JSON on stdout.

    python benchmarks/phases.py DIR [--workers N] [--prefix P] [--profile-tail N]

`--workers` is the command's: the loader's processes, and from 4 the forked children that
share a large job's matching and costliest rules (ARCHITECTURE.md, "Where the work runs").

Stages, in the order `frtrace -d DIR --format json` runs them (frtrace/match/analysis.py `analyze`,
then frtrace/cli/analyse.py): load (find + read + decode + normalise, `load_dumps`, with each dump
dealt into its groups as it arrives, `deal`), build
(`build_layout`), match (`match`), diagnose (`diagnose`), render (`render_json`). Each is
timed with `time.perf_counter`; `import` is the time to import the package; `after_last_file`
is build + match + diagnose + render, what the main process does alone once the last file is
decoded, and its share of the run. After every stage
the process's resident memory (VmRSS) and its high-water mark (VmHWM) are recorded, and `main_cpu_seconds` gives the main
process's own CPU time in each stage (in `load`, near the wall time means the main process, not
the workers, set the pace); they
cover this process only, not the loader's worker processes.

If pipeline.analyze gains a stage, add it here too, or these numbers stop adding up to the
end-to-end time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

_started = time.perf_counter()
from frtrace.diagnosis import diagnose  # noqa: E402
from frtrace.load.layout import build_layout  # noqa: E402
from frtrace.load.loader import load_dumps  # noqa: E402
from frtrace.match.analysis import finish_analysis  # noqa: E402
from frtrace.match.matcher import DealtDumps, match  # noqa: E402
from frtrace.report.render import ReportParts, render_json  # noqa: E402

_imported = time.perf_counter()


def _memory_mb() -> dict:
    """VmRSS and VmHWM of this process in MB (empty where /proc is not available)."""
    out = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(line.split()[1]) / 1024  # kB -> MB
    except OSError:
        pass
    return out


def _record_waits() -> dict:
    """Wrap Forked.collect so that each wait for a child's result is added up by where the
    main process waited (the nearest two callers outside load/forked.py): returns the dict
    it fills, site -> [waits, seconds]."""
    import sys as _sys

    from frtrace.load import forked

    waits: dict = {}
    real = forked.Forked.collect

    def collect(self, wait=True):
        frame, names = _sys._getframe(1), []
        while frame is not None and len(names) < 2:
            if not frame.f_code.co_filename.endswith("forked.py"):
                rule = frame.f_locals.get("rule") if frame.f_code.co_name == "findings" else None
                names.append(frame.f_code.co_name + (f"({rule.__name__})" if callable(rule) else ""))
            frame = frame.f_back
        started = time.perf_counter()
        try:
            return real(self, wait)
        finally:
            site = waits.setdefault(" < ".join(names), [0, 0.0])
            site[0] += 1
            site[1] = round(site[1] + time.perf_counter() - started, 4)

    real_reap = forked.Forked.reap

    def reap(self):
        started = time.perf_counter()
        try:
            return real_reap(self)
        finally:
            site = waits.setdefault("reap (a child exiting)", [0, 0.0])
            site[0] += 1
            site[1] = round(site[1] + time.perf_counter() - started, 4)

    forked.Forked.collect = collect
    forked.Forked.reap = reap
    return waits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/phases.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="loader processes, as frtrace --workers (default: number of cores, as the CLI)")
    parser.add_argument("--prefix", default=None)
    parser.add_argument("--profile-tail", type=int, default=0, metavar="N",
                        help="cProfile the main process after the last file (build to render) and print "
                             "the N costliest functions, by own and by cumulative time, on stderr")
    parser.add_argument("--waits", action="store_true",
                        help="time how long the main process waits for each forked child's result after the "
                             "last file, by where it waits (JSON key waits_after_last_file)")
    args = parser.parse_args(argv)
    gc.disable()  # as frtrace's command line does (see frtrace/cli/analyse.py main)

    seconds = {"import": _imported - _started}
    cpu_seconds = {}
    memory = {}
    clock = time.perf_counter()
    cpu_clock = time.process_time()

    def lap(name: str) -> None:
        nonlocal clock, cpu_clock
        now, cpu_now = time.perf_counter(), time.process_time()
        seconds[name] = now - clock
        cpu_seconds[name] = cpu_now - cpu_clock
        memory[name] = _memory_mb()
        clock, cpu_clock = now, cpu_now

    # As pipeline.analyze does: each dump is dealt into its groups as it arrives (that
    # work is timed as part of the load, where it overlaps the workers').
    dealt = DealtDumps()
    loaded = load_dumps([args.directory], args.prefix, workers=args.workers,
                        on_dump=dealt.add)
    lap("load")
    waits = _record_waits() if args.waits else None
    profiler = None
    if args.profile_tail:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    layout = build_layout(loaded.dumps, loaded.failed_ranks, None)
    lap("build")
    matches = match(loaded.dumps, layout, dealt, processes=args.workers)
    analysis = finish_analysis(loaded, layout, matches)
    lap("match")
    # As the command does (api.diagnose): the report's parts worked out in a forked child
    # of their own, or readied while forked rules run.
    parts = ReportParts(analysis)
    diagnosis = diagnose(analysis, args.workers, meanwhile=None if parts.work_out_apart(args.workers) else parts.ready)
    lap("diagnose")
    report = render_json(analysis, diagnosis, parts)
    lap("render")
    if profiler is not None:
        import pstats
        profiler.disable()
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(args.profile_tail)
        stats.sort_stats("cumulative").print_stats(args.profile_tail)

    total = sum(v for k, v in seconds.items() if k != "import")
    # What the main process does alone once the last file is decoded (issue 27's figure:
    # the share of the run no worker can take today).
    after_last_file = sum(seconds[k] for k in ("build", "match", "diagnose", "render"))
    print(json.dumps({
        "seconds": seconds,
        "main_cpu_seconds": cpu_seconds,
        "total_seconds": total,
        "after_last_file_seconds": after_last_file,
        "after_last_file_share": after_last_file / total if total else 0.0,
        "memory_mb_after": memory,
        "workers": args.workers,
        "ranks": len(loaded.dumps),
        "load_errors": len(loaded.errors),
        "entries": sum(len(d.entries) for d in loaded.dumps),
        "collectives": len(matches.collectives),
        "p2p": len(matches.p2p),
        "status": diagnosis.status,
        "suspect_ranks": list(diagnosis.suspect_ranks),
        "report_bytes": len(report),
        **({"waits_after_last_file": waits} if waits is not None else {}),
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
