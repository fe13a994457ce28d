#!/usr/bin/env python3
"""A synthetic sweep of device stalls on two ranks at once, as NVRx's gpu_error injects them.

    python tools/stall_sweep.py --seed 1

Two random ranks of a 16-rank job stop completing GPU work from one step on (our
generator's `gpu_error` with two culprits): three layouts (TP 2 x PP 2, TP 2 x PP 4,
TP 4 x PP 2), the step's first collective of the TP, DP or PP group, plain and batched
P2P, whole dumps and dumps of only active entries, groups made in one order or each
rank in its own with hashed names: 72 jobs. Prints each verdict that is not the truth
and, last, `right N/M`. A tool, not a test (a minute or two); the cases it found are tests
in tests/test_only_active_siblings.py and tests/test_rules.py.

The truth names both culprits even where one's stall shows in nothing its dump keeps (it
waits in a recv whose send never came, as its victims do): such a miss names fewer
ranks, not others. docs/limits.md says what the misses are.
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
LAYOUTS = [(16, 2, 2), (16, 2, 4), (16, 4, 2)]  # (world, tp, pp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    right = total = 0
    for (world, tp, pp), group, p2p, only_active, order in itertools.product(
            LAYOUTS, ("tp", "dp", "pp"), ("plain", "batched"), (True, False), ("same", "rotated")):
        seed = rng.randrange(1000)
        culprits = tuple(rng.sample(range(world), 2))
        fault = Fault("gpu_error", rank=culprits[0], group=group, step=1 + seed % 2, ranks=culprits)
        try:
            job = generate(world_size=world, tp=tp, pp=pp, steps=3, fault=fault, timing=True, p2p=p2p,
                           only_active=only_active, seed=seed, pg_order=order, hashed_names=order == "rotated", **FAITHFUL)
        except ValueError:  # a group this layout has no op in
            continue
        _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
        total += 1
        if (diagnosis.status, list(diagnosis.suspect_ranks)) == (job.truth["status"], job.truth["suspect_ranks"]):
            right += 1
            continue
        print(f"{world}x{tp}x{pp} {group} culprits {fold_ranks(sorted(culprits))} {p2p} "
              f"{'only-active' if only_active else 'whole'} {order} seed {seed}: truth {job.truth['status']} "
              f"{job.truth['suspect_ranks']}, frtrace {diagnosis.status} [{fold_ranks(diagnosis.suspect_ranks)}]", flush=True)
    print(f"right {right}/{total}")
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main())
