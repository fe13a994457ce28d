#!/usr/bin/env python3
"""Put a fault into a healthy job's dumps and check frtrace's verdict (a tool, not a test).

    python tools/inject_faults.py DIR [DIR ...] --kinds hang,size,gpu,skip --tries 6 --seed 7
    python tools/inject_faults.py DIR --only-active      # then keep only the active entries
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

Then every rank keeps its ops up to the first one that cannot finish, which it holds
unfinished (blocked in it): a collective finishes once every member of its group holds it
and none holds it differently, a send or recv once the other end holds its partner (the
n-th op of the channel counted from the newest: the healthy dumps end with every op
finished); one that fell off a ring counts as finished. pg_status is worked out again
from what each rank keeps. The verdict is right when frtrace says `faults` and names the
culprit alone (for a size, dtype or op fault in a two-member group, a tie naming both).

The dumps written stay under --out, one directory per try, for a look with frtrace. It
prints each wrong verdict and, last, `wrong N of M`. What it cannot show: an all_to_all's
sizes may differ per rank (a size fault there still adds up, and reads as a collective in
flight); identical ops in a row make a skip or an extra op one the dumps never show.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frtrace.load.safe_decode import decode_dump  # noqa: E402

KINDS = ("hang", "size", "dtype", "op", "gpu", "skip", "extra")
_P2P_NAME = re.compile(r"(send|recv) (\d+)(?:->|<-)(\d+)")
_FLIP_DTYPE = {"BFloat16": "Float", "Float": "BFloat16", "Half": "Float", "Long": "Int", "Int": "Long"}


def load_job(directory: Path) -> dict[int, tuple[str, dict]]:
    """rank -> (file name, dump dict) of the files whose names end in a rank number."""
    job = {}
    for path in sorted(directory.iterdir()):
        found = re.search(r"(\d+)$", path.name)
        if found and path.is_file():
            raw = decode_dump(path.read_bytes(), 1 << 31).raw
            job[int(found.group(1))] = (path.name, _plain(raw))
    return job


def _plain(value):
    """The decoded dump as plain dicts and lists (tuples kept where torch writes them)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def group_ranks(job: dict) -> dict[str, list[int]]:
    ranks = {}
    for _, dump in job.values():
        for config in (dump.get("pg_config") or {}).values():
            members = json.loads(config["ranks"]) if isinstance(config["ranks"], str) else config["ranks"]
            if members:
                ranks[config["name"]] = list(members)
    return ranks


def units_of(entries: list[dict]) -> list[tuple[int, int, list]]:
    """(first, end, keys) per unit, in order: a collective (its group's entries under one
    number), a plain P2P op, a P2P batch (its ops and the marker after them), or a
    marker whose ops fell off the ring (no key: it finished). Keys say what must meet:
    ("C", group, number), or ("P", group, entry position), made channel keys later."""
    units, i = [], 0
    while i < len(entries):
        entry, group = entries[i], entries[i]["process_group"][0]
        if entry["is_p2p"]:
            j = i + 1
            while (j < len(entries) and entries[j]["is_p2p"] and entries[j]["process_group"][0] == group
                   and entries[j]["p2p_seq_id"] == entry["p2p_seq_id"]):
                j += 1
            batch = (j < len(entries) and not entries[j]["is_p2p"] and entries[j]["process_group"][0] == group
                     and entries[j]["profiling_name"].endswith(":coalesced"))
            end = j + 1 if batch else (j if j - i == 1 else i + 1)
            units.append((i, end, [("P", group, k) for k in range(i, end) if entries[k]["is_p2p"]]))
            i = end
        elif entry["profiling_name"].endswith(":coalesced"):
            units.append((i, i + 1, []))
            i += 1
        else:
            j = i + 1
            while (j < len(entries) and not entries[j]["is_p2p"] and entries[j]["process_group"][0] == group
                   and entries[j]["collective_seq_id"] == entry["collective_seq_id"]):
                j += 1
            units.append((i, j, [("C", group, entry["collective_seq_id"])]))
            i = j
    return units


class Layout:
    """Every rank's units, with P2P keys made channel keys, and where each key sits."""

    def __init__(self, job: dict, granks: dict[str, list[int]]):
        self.units = {rank: units_of(dump["entries"]) for rank, (_, dump) in job.items()}
        counts: dict = defaultdict(int)
        for rank in sorted(job):
            entries = job[rank][1]["entries"]
            for u in reversed(range(len(self.units[rank]))):
                first, end, keys = self.units[rank][u]
                if keys and keys[0][0] == "P":
                    self.units[rank][u] = (first, end, [self._channel_key(rank, entries, key, granks, counts)
                                                        for key in reversed(keys)])
        self.at: dict[int, dict] = {rank: {} for rank in job}
        self.newest: dict[tuple[int, str], int] = {}
        for rank, units in self.units.items():
            for u, (_, _, keys) in enumerate(units):
                for key in keys:
                    self.at[rank][key] = u
                    if key[0] == "C":
                        self.newest[rank, key[1]] = max(self.newest.get((rank, key[1]), -1), key[2])

    @staticmethod
    def _channel_key(rank, entries, key, granks, counts):
        op, a, b = _P2P_NAME.search(entries[key[2]]["profiling_name"]).groups()
        members = granks[key[1]]
        src, dst = (members[int(a)], members[int(b)]) if op == "send" else (members[int(b)], members[int(a)])
        counts[rank, key[1], src, dst] += 1
        return "P", key[1], src, dst, counts[rank, key[1], src, dst]


def _signature(job, layout, rank, key):
    first, end, _ = layout.units[rank][layout.at[rank][key]]
    return tuple((e["profiling_name"], "" if "all_to_all" in e["profiling_name"] else str(e["input_sizes"]),
                  str(e["input_dtypes"])) for e in job[rank][1]["entries"][first:end])


def _renumbered(job, layout, group, seq, culprit, kind):
    """The job with the culprit's #seq of `group` left out (skip) or an all_reduce put
    before it (extra), its later ops of the group numbered on from there."""
    name, dump = job[culprit]
    dump = copy.deepcopy(dump)
    entries = dump["entries"]
    first, end, _ = layout.units[culprit][layout.at[culprit][("C", group, seq)]]
    if kind == "skip":
        shift, kept = -1, entries[:first]
        later = entries[end:]
    else:
        extra = copy.deepcopy(entries[first])
        extra.update(profiling_name="nccl:all_reduce", input_sizes=[[1]], output_sizes=[[1]],
                     input_dtypes=["Float"], output_dtypes=["Float"])
        shift, kept, later = 1, entries[:first] + [extra], entries[first:]
    moved = -(end - first) if kind == "skip" else 1
    for entry in later:
        entry = dict(entry, record_id=entry["record_id"] + moved)
        if entry["process_group"][0] == group:
            entry["collective_seq_id"] += shift
        kept.append(entry)
    dump["entries"] = kept
    return {**job, culprit: (name, dump)}


def inject(job: dict, kind: str, rng: random.Random):
    """(the job's dumps with the fault, what was injected), or None when no collective fits."""
    granks = group_ranks(job)
    layout = Layout(job, granks)
    candidates = []
    for group, members in sorted(granks.items()):
        if len(members) < 2 or any(rank not in job for rank in members):
            continue
        shared = sorted(set.intersection(*({k[2] for k in layout.at[r] if k[0] == "C" and k[1] == group}
                                            for r in members)))
        if len(shared) >= 4:
            candidates += [(group, seq) for seq in shared[len(shared) // 2:-1]]
    if not candidates:
        return None
    group, seq = rng.choice(candidates)
    culprit = rng.choice(granks[group])
    key = ("C", group, seq)
    never = {key} if kind in ("size", "dtype", "op") else set()
    if kind in ("skip", "extra"):
        job = _renumbered(job, layout, group, seq, culprit, kind)
        layout = Layout(job, granks)
        for number in {k for r in granks[group] for k in layout.at[r] if k[0] == "C" and k[1] == group and k[2] >= seq}:
            if len({_signature(job, layout, r, number) for r in granks[group] if number in layout.at[r]}) > 1:
                never.add(number)
    reached = {rank: len(layout.units[rank]) for rank in job}
    queued = 0
    if kind == "hang":
        reached[culprit] = layout.at[culprit][key]
    elif kind == "gpu":
        reached[culprit] = layout.at[culprit][key] + 1
        queued = rng.choice([0, 1, 2, 3])
    blocked = _settle(job, layout, granks, reached, never, stays=culprit if kind in ("hang", "gpu") else None)
    dumps = {}
    for rank, (name, dump) in job.items():
        if rank == culprit and kind == "gpu":
            dumps[rank] = (name, _stalled(dump, layout.units[rank], layout.at[rank][key], queued))
        else:
            dumps[rank] = (name, _cut(dump, layout.units[rank], reached[rank], rank in blocked, key, culprit == rank,
                                      kind))
    return dumps, {"group": group, "seq": seq, "culprit": culprit, "kind": kind, "members": len(granks[group])}


def _settle(job, layout, granks, reached, never, stays):
    """Cut each rank's units at the first one that cannot finish (kept: it is blocked in
    it), until nothing changes; the rank `stays` keeps what it was given. Returns the
    ranks blocked."""
    def partners(key, rank):
        return [p for p in granks[key[1]] if p != rank] if key[0] == "C" else [key[3] if rank == key[2] else key[2]]

    def can_finish(rank, key):
        if key in never:
            return False
        for peer in partners(key, rank):
            where = layout.at.get(peer, {}).get(key)
            if where is None:  # fell off its ring, long finished; or newer than all it holds
                if key[0] == "C" and key[2] > layout.newest.get((peer, key[1]), -1):
                    return False
            elif where >= reached[peer]:
                return False
        return True

    blocked: set[int] = set()
    changed = True
    while changed:
        changed = False
        for rank in job:
            if rank == stays:
                continue
            for u in range(reached[rank]):
                if not all(can_finish(rank, key) for key in layout.units[rank][u][2]):
                    blocked.add(rank)
                    if u + 1 < reached[rank]:
                        reached[rank], changed = u + 1, True
                    break
    return blocked


def _unfinished(entries, first, end, started):
    for entry in entries[first:end]:
        batch_op = entry["is_p2p"] and end - first > 1
        entry["state"] = "started" if started and not batch_op else "scheduled"
        entry["time_discovered_completed_ns"] = None
        if not started:
            entry["time_discovered_started_ns"] = None
        if "duration_ms" in entry:
            entry["duration_ms"] = None
        entry["retired"] = False


def _cut(dump, units, kept, blocked, key, is_culprit, kind):
    dump = copy.deepcopy(dump)
    cut = units[kept - 1][1] if kept else 0
    dropped, dump["entries"] = dump["entries"][cut:], dump["entries"][:cut]
    last_holds_fault = kept and key in units[kept - 1][2]
    if kept and blocked:
        first, end, _ = units[kept - 1]
        _unfinished(dump["entries"], first, end, True)
        if is_culprit and kind in ("size", "dtype", "op") and last_holds_fault:
            _alter(dump["entries"][first], kind)
    return _with_status(dump, dropped)


def _alter(entry, kind):
    if kind == "size":
        for field in ("input_sizes", "output_sizes"):
            entry[field] = [[shape[0] + 1, *shape[1:]] if shape else [1] for shape in entry[field]]
    elif kind == "dtype":
        for field in ("input_dtypes", "output_dtypes"):
            entry[field] = [_FLIP_DTYPE.get(dtype, "Float") for dtype in entry[field]]
    else:
        entry["profiling_name"] = "nccl:all_reduce" if "broadcast" in entry["profiling_name"] else "nccl:broadcast"


def _stalled(dump, units, at, queued):
    dump = copy.deepcopy(dump)
    kept = min(len(units), at + 1 + queued)
    cut = units[kept - 1][1]
    dropped, dump["entries"] = dump["entries"][cut:], dump["entries"][:cut]
    for u in range(at, kept):
        first, end, _ = units[u]
        _unfinished(dump["entries"], first, end, u == at)
    return _with_status(dump, dropped)


def _with_status(dump, dropped):
    """pg_status from the kept entries: enqueued is the newest collective kept (or, with
    none kept, the one before the first dropped), completed the one before the oldest
    unfinished one kept."""
    group_of_pg = {}
    for entry in dump["entries"] + dropped:
        group_of_pg.setdefault(str(entry["pg_id"]), entry["process_group"][0])
    for pg_id, status in (dump.get("pg_status") or {}).items():
        group = group_of_pg.get(str(pg_id))
        if group is None:
            continue
        kept = [e for e in dump["entries"] if e["process_group"][0] == group and not e["is_p2p"]
                and not e["profiling_name"].endswith(":coalesced")]
        later = [e for e in dropped if e["process_group"][0] == group]
        if kept:
            enqueued = max(e["collective_seq_id"] for e in kept)
            unfinished = [e["collective_seq_id"] for e in kept if e["state"] != "completed"]
            completed = min(unfinished) - 1 if unfinished else enqueued
            started = max([e["collective_seq_id"] for e in kept if e["state"] in ("started", "completed")] or [completed])
        elif later:
            enqueued = completed = started = later[0]["collective_seq_id"] - (0 if later[0]["is_p2p"] else 1)
        else:
            continue
        status.update(last_enqueued_collective=enqueued, last_started_collective=started,
                      last_completed_collective=completed)
    return dump


def write_job(dumps: dict, directory: Path, only_active: bool, wrap: bool) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for rank, (name, dump) in dumps.items():
        entries = dump["entries"]
        if only_active:
            entries = [e for e in entries if e["state"] != "completed"]
        if wrap:
            keep = int(len(entries) * (0.5 + 0.5 * ((rank * 7919) % 97) / 97))
            entries = entries[len(entries) - keep:]
        (directory / name).write_bytes(pickle.dumps({**dump, "entries": entries}))


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
    wrong = tried = 0
    for directory in args.dirs:
        job = load_job(directory)
        for kind in kinds:
            for attempt in range(args.tries):
                injected = inject(job, kind, rng)
                if injected is None:
                    continue
                dumps, what = injected
                out = args.out / f"{directory.name}-{kind}-{attempt}"
                write_job(dumps, out, args.only_active, args.wrap)
                status, suspects, said = verdict(out)
                tried += 1
                tie_allowed = kind in ("size", "dtype", "op") and what["members"] == 2
                right = status == "faults" and (suspects == [what["culprit"]] or (
                    tie_allowed and what["culprit"] in suspects and len(suspects) == 2))
                if not right:
                    wrong += 1
                    print(f"WRONG {out.name}: group {what['group']} #{what['seq']} culprit {what['culprit']} "
                          f"({what['members']} members): {status} {suspects} | {said[:160]}", flush=True)
    print(f"wrong {wrong} of {tried}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
