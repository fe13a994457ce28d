#!/usr/bin/env python3
"""Put a fault into a healthy job's dumps and check frtrace's verdict (a tool, not a test).

    python tools/inject_faults.py DIR [DIR ...] --kinds hang,size,gpu,skip --tries 6 --seed 7
    python tools/inject_faults.py DIR --only-active      # then keep only the active entries
    python tools/inject_faults.py DIR --kinds hang2,gpu2   # two ranks at one moment (NVRx)
    python tools/inject_faults.py DIR --wrap             # each rank's ring keeps 50-100 % of them

Each DIR holds one healthy NCCL job's dumps, whole, ending with every op finished (read
with frtrace's own decoder). A try draws a group G, a collective #k that every member of G
holds in the newer half of what they share, and a culprit among G's members, then:

    hang   the culprit stops issuing before #k (a host-side hang);
    size, dtype, op   its #k differs from its peers' (first dimension + 1, another dtype,
           a broadcast): #k never finishes;
    gpu    its GPU stops reporting after its part of #k: its peers finish #k, it holds #k
           unfinished and up to 3 ops queued after it;
    skip, extra   it leaves #k out, or issues an all_reduce of one float before it, and
           numbers its later ops of G accordingly: wherever they then differ from its
           peers' at one number, that collective never finishes.
    p2pskip   (no group drawn) a rank leaves out its newest P2P op or batch on its
           channels and numbers its later P2P ops one less: the ops it would have met
           never finish.
    p2pstep   the same for a P2P op or batch in the newer half of the rank's, not its
           last: its later ops pair by their place in the program, as the independent
           generators write a skipped ring step (NCCL would pair them in order).
    hang2, gpu2   a hang or a GPU that stops reporting on two ranks at one moment, as
           NVRx injects them: the culprit at #k, and a second rank drawn from the whole
           job at its first op created then or later (the dumps share that clock),
           wherever it is. Right when both are named; naming one of the two is counted
           apart (the second may stop where nothing shows it: behind the first).

Then every rank keeps its ops up to the first one that cannot finish, which it holds
unfinished (blocked in it): a collective finishes once every member of its group holds it
and none holds it differently, a send or recv once the other end holds its partner (the
n-th op of the channel counted from the newest: the healthy dumps end with every op
finished); one that fell off a ring counts as finished. pg_status is worked out again
from what each rank keeps. The verdict is right when frtrace says `faults` and names the
culprit alone (for a size, dtype or op fault in a two-member group, a tie naming both).
With --only-active a skip or an extra op in a two-member group may be a tie too: the dumps
keep no earlier op of the pair to tell which of two sequences is the odd one; such ties
are counted apart.

The dumps written stay under --out, one directory per try, for a look with frtrace. It
prints each wrong verdict and, last, `wrong N of M`. What it cannot show: an all_to_all's
sizes may differ per rank (a size fault there still adds up, and reads as a collective in
flight); identical ops in a row make a skip or an extra op one the dumps never show.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frtrace.load.safe_decode import decode_dump  # noqa: E402
from frtrace.testing.inject import KINDS, inject, only_active, wrapped  # noqa: E402


def load_job(directory: Path) -> dict[int, tuple[str, dict]]:
    """rank -> (file name, dump dict) of the files whose names end in a rank number."""
    job = {}
    for path in sorted(directory.iterdir()):
        found = re.search(r"(\d+)$", path.name)
        if found and path.is_file():
            raw = decode_dump(path.read_bytes(), 1 << 31).raw
            job[int(found.group(1))] = (path.name, raw)
    return job


def write_job(dumps: dict, directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for name, dump in dumps.values():
        (directory / name).write_bytes(pickle.dumps(dump))


def verdict(directory: Path) -> tuple[str, list[int], str]:
    done = subprocess.run([sys.executable, "-m", "frtrace", str(directory), "--format", "json", "--workers", "1"],
                          capture_output=True, text=True)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return "error", [], done.stderr[-300:]
    return report["status"], report["suspect_ranks"], report.get("summary", "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--tries", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only-active", action="store_true")
    parser.add_argument("--wrap", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/inject_faults"))
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; known: {','.join(KINDS)}")
    rng = random.Random(args.seed)
    wrong = tried = ties = fewer = 0
    for directory in args.dirs:
        job = load_job(directory)
        for kind in kinds:
            for attempt in range(args.tries):
                injected = inject(job, kind, rng)
                if injected is None:
                    continue
                dumps, what = injected
                out = args.out / f"{directory.name}-{kind}-{attempt}"
                if args.only_active:
                    dumps = only_active(dumps)
                if args.wrap:
                    dumps = wrapped(dumps)
                write_job(dumps, out)
                status, suspects, said = verdict(out)
                tried += 1
                if "culprits" in what:  # two at once: the second may stop where nothing shows it
                    named = set(suspects) <= set(what["culprits"]) and bool(suspects)
                    right = status == "faults" and suspects == what["culprits"]
                    fewer += status == "faults" and named and not right
                    if not right and not (status == "faults" and named):
                        wrong += 1
                        print(f"WRONG {out.name}: group {what['group']} #{what['seq']} culprits {what['culprits']}: "
                              f"{status} {suspects} | {said[:160]}", flush=True)
                    continue
                tie_allowed = kind in ("size", "dtype", "op") and what["members"] == 2
                right = status == "faults" and (suspects == [what["culprit"]] or (
                    tie_allowed and what["culprit"] in suspects and len(suspects) == 2))
                undecidable = (args.only_active and kind in ("skip", "extra") and what["members"] == 2
                               and status == "faults" and what["culprit"] in suspects and len(suspects) == 2)
                if undecidable:
                    ties += 1
                elif not right:
                    wrong += 1
                    print(f"WRONG {out.name}: group {what['group']} #{what['seq']} culprit {what['culprit']} "
                          f"({what['members']} members): {status} {suspects} | {said[:160]}", flush=True)
    print(f"wrong {wrong} of {tried}" + (f" ({ties} more: ties the dumps cannot break)" if ties else "")
          + (f" ({fewer} more: one of two culprits named)" if fewer else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
