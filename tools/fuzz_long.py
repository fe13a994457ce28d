#!/usr/bin/env python3
"""Run the fuzz properties of tests/test_fuzz.py with many more examples, and count.

Unlike the CI tests, a crash does not stop the run: every exception is recorded under a
signature (exception type, the first words of its message, the innermost frtrace frame),
with how often it happened and one input that caused it, marked "known" when it matches
test_fuzz.KNOWN_CRASHES. At the end each property prints how many inputs ran, what the
outcomes were, and the crash table. Exit status 1 when a crash outside KNOWN_CRASHES (or
a slow / memory finding) was seen.

    python tools/fuzz_long.py                      # 20,000 inputs per property
    python tools/fuzz_long.py -n 2000 --seed 7 --only load_one generated_any
    python tools/fuzz_long.py --minutes 2          # stop each property after 2 minutes

The process caps its own address space (--max-memory-mb, default 3072): some inputs make
the unpickler allocate gigabytes (see the memo-index bomb in test_broken_inputs.py). Inputs
that take longer than --slow seconds, or raise the process's peak memory by more than
200 MB, are listed as "slow" / "memory" findings with an example.
"""

from __future__ import annotations

import argparse
import reprlib
import resource
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_fuzz as tf  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROPERTIES = {
    # name: (strategies for the check's arguments, check)
    "load_one": ({"source": st.integers(min_value=0, max_value=len(tf.SOURCES) - 1), "edits": tf.mutations},
                 tf.check_load_one),
    "mutated_rank_pipeline": ({"rank": st.integers(min_value=0, max_value=3), "edits": tf.mutations,
                               "as_json": st.booleans(), "healthy": st.booleans()},
                              tf.check_pipeline_with_a_mutated_rank),
    "generated_safe": ({"job": tf._jobs(tf.safe_scalars), "encoding": st.sampled_from(["pickle", "json"])},
                       tf.check_generated_job),
    "generated_any": ({"job": tf._jobs(tf.any_values), "encoding": st.sampled_from(["pickle", "json"])},
                      tf.check_generated_job),
    "hostile_shapes": ({"shape": tf.hostile_shapes}, lambda shape: tf.check_hostile_shape(*shape)),
    "archives": ({"kind": st.sampled_from(["zip", "tar", "tgz"]), "members": tf.archive_members,
                  "overlap": st.booleans(), "edits": st.one_of(st.just([]), st.just([]), tf.mutations)},
                 tf.check_archive),
    "outputs_escaped": ({"texts": st.lists(tf.hostile_text, min_size=1, max_size=7)}, tf.check_outputs_escaped),
}


class _OutOfTime(BaseException):
    """Raised from inside the property to end a run early (not an Exception: hypothesis
    does not treat it as a failing input)."""


def _short_repr(value, limit: int = 300) -> str:
    short = reprlib.Repr()
    short.maxstring, short.maxother, short.maxlong, short.maxlevel = 60, 60, 60, 4
    short.maxdict = short.maxlist = short.maxtuple = 6
    try:
        text = short.repr(value)
    except Exception as exc:  # noqa: BLE001 - e.g. a 5000-digit int
        text = f"<unprintable: {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _signature(exc: BaseException) -> tuple:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/frtrace/" in f.filename.replace("\\", "/")]
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno} {ours[-1].name}" if ours else "(outside frtrace)"
    message = " ".join(str(exc).split()[:8])
    return type(exc).__name__, message, where


def run_property(name: str, examples: int, seed_value: int, minutes: float, slow: float = 2.0) -> dict:
    strategies, check = PROPERTIES[name]
    outcomes: Counter = Counter()
    crashes: dict = {}
    slowest = [0.0]
    started = time.monotonic()
    deadline = started + minutes * 60 if minutes else None

    peak = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]

    def note(key, kwargs, known=True):
        if key not in crashes:
            crashes[key] = {"count": 0, "known": known, "example": _short_repr(kwargs)}
        crashes[key]["count"] += 1

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
    @seed(seed_value)
    @given(**strategies)
    def prop(**kwargs):
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime()
        began = time.monotonic()
        try:
            outcomes[str(check(**kwargs))] += 1
        except Exception as exc:  # noqa: BLE001 - count it, keep going
            note(_signature(exc), kwargs, tf.known_crash(exc))
            outcomes["crash"] += 1
        took = time.monotonic() - began
        if took > slow:
            note(("slow", f"over {slow:g}s (max so far {max(took, slowest[0]):.1f}s)", ""), kwargs, known=False)
            slowest[0] = max(slowest[0], took)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if rss > peak[0] + 200_000:
            note(("memory", f"peak RSS {peak[0] // 1024} -> {rss // 1024} MB", ""), kwargs, known=False)
            peak[0] = rss

    try:
        prop()
    except _OutOfTime:
        pass
    return {"name": name, "seconds": time.monotonic() - started, "outcomes": outcomes, "crashes": crashes}


def print_result(result: dict) -> None:
    outcomes = result["outcomes"]
    total = sum(outcomes.values())
    print(f"\n== {result['name']}: {total:,} inputs in {result['seconds']:.0f}s")
    print("   outcomes: " + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1])))
    if not result["crashes"]:
        print("   crashes: none")
        return
    for (kind, message, where), info in sorted(result["crashes"].items(), key=lambda kv: -kv[1]["count"]):
        tag = "known" if info["known"] else "NEW"
        print(f"   [{tag}] {info['count']:,}x {kind}: {message}" + (f" at {where}" if where else ""))
        print(f"          e.g. {info['example']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--examples", type=int, default=20_000, help="inputs per property (default 20000)")
    parser.add_argument("--seed", type=int, default=20260522)
    parser.add_argument("--minutes", type=float, default=0, help="stop each property after this long (0: no limit)")
    parser.add_argument("--only", nargs="+", choices=sorted(PROPERTIES), help="run only these properties")
    parser.add_argument("--slow", type=float, default=2.0, help="report inputs slower than this many seconds")
    parser.add_argument("--max-memory-mb", type=int, default=3072, help="address-space cap for this process")
    args = parser.parse_args(argv)
    cap = args.max_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(f"frtrace long fuzz: {args.examples:,} inputs per property, seed {args.seed}, "
          f"{len(tf.SOURCES)} byte sources ({', '.join(name for name, _ in tf.SOURCES)})")
    new = False
    for name in args.only or PROPERTIES:
        result = run_property(name, args.examples, args.seed, args.minutes, args.slow)
        print_result(result)
        new |= any(not info["known"] for info in result["crashes"].values())
        sys.stdout.flush()
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
