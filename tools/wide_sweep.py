#!/usr/bin/env python3
"""A wide synthetic sweep of full dumps, as PyTorch records them, against the generator's truth.

    python tools/wide_sweep.py --seed 1 --lookahead 6

Pipeline depths 2/4/8, P2P plain/batched/mixed, timing on and off, ring buffers whole and
wrapped, and 14 fault kinds, each at a random rank and step (from --seed): 504 jobs,
analysed in memory. Every job is written the way torch's NCCL Flight Recorder writes
(batch markers, watchdog-tick discovery times, receivers posting first, pg_status in the
Work's numbering). Prints each wrong verdict and, last, `right N/504`. Slow (minutes):
a tool, not a test; tests/test_synth_faithful_sweep.py is the test.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import analyse_dicts  # noqa: E402

from frtrace.testing.synth import Fault, generate  # noqa: E402
from frtrace.util import fold_ranks  # noqa: E402

FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}
LAYOUTS = {2: (16, 2, 2), 4: (32, 2, 4), 8: (32, 2, 8)}  # depth -> (world, tp, pp)
FAULTS = ["none", "hang:tp", "hang:dp", "hang:pp", "skip_op:tp", "extra_op:dp", "size_mismatch:tp", "op_mismatch:dp",
          "dtype_mismatch:tp", "p2p_unmatched:pp", "missing_dump:", "missing_dump_hang:tp", "straggler:", "stuck:tp"]


def verdict_is_right(kind: str, rank: int, truth: dict, diagnosis) -> bool:
    if kind == "straggler":  # a warning naming the slow rank, on a job otherwise healthy
        return diagnosis.status == "healthy" and any(f.kind == "straggler" and rank in f.ranks for f in diagnosis.findings)
    return (diagnosis.status, list(diagnosis.suspect_ranks)) == (truth["status"], truth["suspect_ranks"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lookahead", type=int, default=0, help="ops a host enqueues ahead of the one it waits in")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    right = total = 0
    for depth, p2p, timing, buffer, fault in itertools.product(LAYOUTS, ("plain", "batched", "mixed"), (False, True),
                                                               (2000, 60), FAULTS):
        world, tp, pp = LAYOUTS[depth]
        kind, _, group = fault.partition(":")
        rank = rng.randrange(world)
        injected = None if kind == "none" else Fault(kind, rank=rank, group=group or "tp", step=rng.randrange(1, 3))
        job = generate(world, tp, pp, steps=4, fault=injected, p2p=p2p, timing=timing, seed=rng.randrange(1000),
                       buffer_size=buffer, lookahead=args.lookahead, **FAITHFUL)
        _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
        total += 1
        if verdict_is_right(kind, rank, job.truth, diagnosis):
            right += 1
            continue
        roots = [f for f in diagnosis.findings if f.is_root and f.suspect_ranks]
        print(f"pp{depth}-{p2p}-timing{int(timing)}-buffer{buffer}-{fault} rank {rank}: truth {job.truth['status']} "
              f"{job.truth['suspect_ranks']}, frtrace {diagnosis.status} [{fold_ranks(diagnosis.suspect_ranks)}] "
              + " | ".join(f"{f.rule}: {f.message[:120]}" for f in roots[:2]))
    print(f"right {right}/{total}")
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main())
