#!/usr/bin/env python3
"""A synthetic sweep of device stalls on two ranks at once, as NVRx's gpu_error injects them.

    python tools/stall_sweep.py --seed 1
    python tools/stall_sweep.py --seed 1 --kind hang   # two hosts that stop issuing (LOCK_GIL)
    python tools/stall_sweep.py --seed 1 --at-once     # both stop at one moment, as NVRx injects

Two random ranks of a 16-rank job stop completing GPU work from one step on (our
generator's `gpu_error` with two culprits): three layouts (TP 2 x PP 2, TP 2 x PP 4,
TP 4 x PP 2), the step's first collective of the TP, DP or PP group, plain and batched
P2P, whole dumps and dumps of only active entries, groups made in one order or each
rank in its own with hashed names: 72 jobs. With `--kind hang` the two hosts stop
issuing instead, each at that collective of its own group (NVRx's LOCK_GIL). With
`--at-once` the second culprit stops at the moment the first does, wherever it is in its own
program (NVRx starts both faults after one delay). Prints each verdict that is not the truth
and, last, `right N/M` (tools/shape_sweep.py's run_jobs). A tool, not a test (a minute
or two); the cases it found are tests in tests/test_only_active_siblings.py and
tests/test_rules.py.

The truth names both culprits even where one's stall shows in nothing its dump keeps (it
waits in a recv whose send never came, as its victims do): such a miss names fewer
ranks, not others. docs/limits.md says what the misses are.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from typing import Iterator

from shape_sweep import FAITHFUL, run_jobs  # tools/ is this script's directory

from frtrace.testing.synth import Fault
from frtrace.util import fold_ranks

LAYOUTS = [(16, 2, 2), (16, 2, 4), (16, 4, 2)]  # (world, tp, pp)


def jobs(seed: int, kind: str = "gpu_error", at_once: bool = False) -> Iterator[tuple[str, dict]]:
    """(label, generate's arguments) of every job, the random draws made in one order."""
    rng = random.Random(seed)
    for (world, tp, pp), group, p2p, only_active, order in itertools.product(
            LAYOUTS, ("tp", "dp", "pp"), ("plain", "batched"), (True, False), ("same", "rotated")):
        job_seed = rng.randrange(1000)
        culprits = tuple(rng.sample(range(world), 2))
        label = (f"{world}x{tp}x{pp} {group} culprits {fold_ranks(sorted(culprits))} {p2p} "
                 f"{'only-active' if only_active else 'whole'} {order} seed {job_seed}")
        # At once, a culprit stops wherever it is: a step after the fault's keeps its host
        # issuing until it blocks (late in the last step, nothing may wait on it).
        yield label, dict(world_size=world, tp=tp, pp=pp, steps=4 if at_once else 3, timing=True, p2p=p2p,
                          only_active=only_active, seed=job_seed, pg_order=order, hashed_names=order == "rotated",
                          fault=Fault(kind, rank=culprits[0], group=group, step=1 + job_seed % 2, ranks=culprits,
                                      at_once=at_once),
                          **FAITHFUL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kind", choices=("gpu_error", "hang"), default="gpu_error",
                        help="GPUs that stop completing work, or hosts that stop issuing (NVRx's LOCK_GIL)")
    parser.add_argument("--at-once", action="store_true",
                        help="the second culprit stops at the first's moment, wherever it is in its program "
                             "(as NVRx injects both after one delay), not at the same collective of its own")
    args = parser.parse_args()
    return run_jobs(jobs(args.seed, args.kind, args.at_once))


if __name__ == "__main__":
    sys.exit(main())
