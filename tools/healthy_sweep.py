#!/usr/bin/env python3
"""A hunt for false FAULTs: healthy and in-flight jobs of every shape and dump style.

    python tools/healthy_sweep.py --seed 2 --jobs 1500

Each job is drawn at random from our generator's options: pipelines, interleaved pipelines
and context-parallel rings; eight layouts (TP 1 to 4, PP 2 to 8, one replica or more);
plain, batched and mixed P2P; timing on or off; dumps whole, with only their active
entries, or with rings that wrapped; groups made in one order or each rank in its own,
with hashed names; in one order, half the time with ids taken by groups no dump names
(as in the real NVRx dumps); batch markers or events; watchdog-polled times; CPU
run-ahead. A third of the jobs are dumped while a family of groups is in the middle of a
collective (`in_flight`: not a fault). No job holds a fault, so any FAULT is the worst error frtrace
can make: each is printed with the job's options, then the tally of verdicts. Exit 1 when
any job was a FAULT. A tool, not a test (a minute or two a thousand jobs).

A healthy job read as inconclusive is printed too: not wrong, but worth a look.
`--without-one-dump` removes one rank's dump from each job (drawn apart, so the jobs of a
seed stay the same): a lost dump then explains nothing, and inconclusive is the right
answer, not a FAULT naming the rank that left no dump.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import analyse_dicts  # noqa: E402

from frtrace.testing.synth import Fault, generate  # noqa: E402
from frtrace.util import fold_ranks  # noqa: E402

LAYOUTS = [(8, 2, 2), (16, 2, 4), (16, 1, 8), (32, 2, 4), (16, 4, 2), (8, 1, 4), (32, 4, 4), (24, 2, 3)]  # world, tp, pp
SHAPES = ["pp", "vpp", "ring"]
BUFFERS = [30, 60, 120, 250]  # entries per rank, when the ring wraps


def jobs(seed: int, count: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(label, "none" or "in_flight", generate's arguments) of each job, drawn in one order."""
    rng = random.Random(seed)
    # Its own draws, so that the jobs of a seed are those of before it was added.
    unnamed = random.Random(f"unnamed-{seed}")
    for _ in range(count):
        world, tp, pp = rng.choice(LAYOUTS)
        shape = rng.choice(SHAPES)
        kind = rng.choice(["none", "none", "in_flight"])
        steps = rng.choice([2, 3, 5])
        params: dict[str, Any] = dict(
            world_size=world, tp=tp, pp=pp, steps=steps, timing=rng.random() < 0.7,
            p2p=rng.choice(["plain", "batched", "mixed"]), only_active=rng.random() < 0.4, seed=rng.randrange(1000),
            lookahead=rng.choice([0, 0, 2]), pg_order=rng.choice(["same", "rotated"]),
            coalesced_events=rng.choice(["batch", "marker"]), watchdog_ms=rng.choice([None, 100.0]),
            bubble_ms=rng.choice([0.0, 100.0]), pg_status=rng.choice(["collectives", "work"]))
        params["hashed_names"] = params["pg_order"] == "rotated" and rng.random() < 0.7
        if params["pg_order"] == "same" and unnamed.random() < 0.5:
            params["pg_order"] = "unnamed"  # ids taken by groups no dump names (real NVRx dumps)
        if rng.random() < 0.3:
            params["buffer_size"] = rng.choice(BUFFERS)
        if shape == "vpp":
            params["vchunks"] = 2
        elif shape == "ring":
            params["ring"] = True
        if kind == "in_flight":
            params["fault"] = Fault("in_flight", rank=rng.randrange(world), group=rng.choice(["tp", "dp", "pp"]),
                                    step=rng.randrange(1, steps))
        label = f"{shape} {kind} " + " ".join(f"{key}={value}" for key, value in params.items())
        yield label, kind, params


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--without-one-dump", action="store_true", help="remove one rank's dump from each job")
    args = parser.parse_args()
    tally: Counter[str] = Counter()
    lost = random.Random(f"lost-{args.seed}")
    for label, kind, params in jobs(args.seed, args.jobs):
        try:
            job = generate(**params)
        except ValueError:  # a family the shape has none of (a pipeline group in a ring)
            tally["refused"] += 1
            continue
        dumps = dict(job.dumps)
        if args.without_one_dump:
            missing = lost.randrange(params["world_size"])
            del dumps[missing]
            label += f" without rank {missing}'s dump"
        _, diagnosis = analyse_dicts(dumps, render=False)
        tally[diagnosis.status] += 1
        if diagnosis.status == "faults":
            print(f"FALSE FAULT [{fold_ranks(diagnosis.suspect_ranks)}]: {label}", flush=True)
        elif diagnosis.status == "inconclusive" and kind == "none" and not args.without_one_dump:
            print(f"inconclusive (healthy): {label}", flush=True)
    print(", ".join(f"{status} {count}" for status, count in sorted(tally.items())))
    return 1 if tally["faults"] else 0


if __name__ == "__main__":
    sys.exit(main())
