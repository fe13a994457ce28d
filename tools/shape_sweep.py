#!/usr/bin/env python3
"""A synthetic sweep of the job shapes tools/wide_sweep.py leaves out: rings and interleaved pipelines, whole and only-active.

    python tools/shape_sweep.py --seed 5            # every job
    python tools/shape_sweep.py --seed 5 --part 0/2  # half of them (run the other half beside it)

Context-parallel rings (`ring=True`: TP x CP x DP) and interleaved pipelines (`vchunks=2`),
four layouts each, 14 fault kinds and a healthy job, plain and batched P2P, dumps whole
and with only their active entries (NVRx, Megatron): about 300 jobs, each fault at a rank,
step and run-ahead drawn from --seed, written as torch's NCCL Flight Recorder writes them.
Prints each wrong verdict and, last, `right N/M`. A tool, not a test (minutes); the
cases it found are tests in tests/test_job_shapes.py and tests/test_only_active_siblings.py.
Ties in two-member groups (a size, dtype or op mismatch whose siblings cannot vote, as
in only-active dumps) print as wrong: their truth names one rank.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path
from typing import Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import analyse_dicts  # noqa: E402

from frtrace.testing.synth import Fault, generate  # noqa: E402
from frtrace.util import fold_ranks  # noqa: E402

FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}
LAYOUTS = {  # shape -> (world, tp, pp or cp)
    "ring": [(16, 2, 4), (8, 1, 4), (32, 2, 4), (16, 2, 8)],
    "vpp": [(16, 2, 4), (32, 2, 4), (16, 1, 8), (32, 2, 8)],
}
FAULTS = ["hang:tp", "hang:dp", "hang:pp", "skip_op:tp", "skip_op:dp", "extra_op:dp", "extra_op:tp", "size_mismatch:tp",
          "op_mismatch:dp", "p2p_unmatched:pp", "missing_dump_hang:tp", "stuck:tp", "skip_ring_step:pp", "none:"]


def jobs(seed: int):
    """(label, generate's arguments) of every job, the random draws made in one order."""
    rng = random.Random(seed)
    for shape, layouts in LAYOUTS.items():
        for (world, tp, pp), fault, p2p, only_active in itertools.product(layouts, FAULTS, ("plain", "batched"),
                                                                          (False, True)):
            kind, _, group = fault.partition(":")
            job_seed, rank, lookahead = rng.randrange(1000), rng.randrange(world), rng.choice([0, 0, 2])
            if kind == "skip_ring_step" and shape != "ring":
                continue
            if (group == "tp" and tp == 1) or (group == "dp" and world // (tp * pp) == 1):
                continue
            injected = None if kind == "none" else Fault(kind, rank=rank, group=group, step=1 + job_seed % 2)
            label = (f"{shape} {world}x{tp}x{pp} {fault} rank {rank} {p2p} {'only-active' if only_active else 'whole'} "
                     f"seed {job_seed} lookahead {lookahead}")
            yield label, dict(world_size=world, tp=tp, pp=pp, steps=3, fault=injected, timing=True, p2p=p2p,
                              only_active=only_active, seed=job_seed, lookahead=lookahead,
                              **({"ring": True} if shape == "ring" else {"vchunks": 2}), **FAITHFUL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--part", default="0/1", help="K/N: the K-th of N interleaved shares of the jobs")
    args = parser.parse_args()
    part, parts = (int(x) for x in args.part.split("/"))
    return run_jobs(label_params for index, label_params in enumerate(jobs(args.seed)) if index % parts == part)


def run_jobs(labelled: Iterable[tuple[str, dict]]) -> int:
    """Generate each (label, generate's arguments) job, judge it against its truth, print
    each wrong verdict and then `right N/M`; 1 when any was wrong (tools/stall_sweep.py
    runs its jobs through this too)."""
    right = total = refused = 0
    for label, params in labelled:
        try:
            job = generate(**params)
        except ValueError:  # a fault this shape has no op for (e.g. a pipeline group's collective in a ring)
            refused += 1
            continue
        _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
        total += 1
        if (diagnosis.status, list(diagnosis.suspect_ranks)) == (job.truth["status"], job.truth["suspect_ranks"]):
            right += 1
            continue
        print(f"{label}: truth {job.truth['status']} {job.truth['suspect_ranks']}, "
              f"frtrace {diagnosis.status} [{fold_ranks(diagnosis.suspect_ranks)}]", flush=True)
    print(f"right {right}/{total}" + (f" ({refused} fault(s) the generator has no op for, left out)" if refused else ""))
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main())
