"""Faults put into a healthy job's dumps (NCCL, whole, every op finished at the end).

Takes rank -> (file name, dump dict) of a healthy job; returns the same with a fault:
a host-side hang, a size, dtype or op mismatch, a GPU that stops reporting, a skipped
or an extra collective, at a collective #k of a group that every member holds, each rank
then cut at the op it would block in (see tools/inject_faults.py, which runs it on dump
directories and reads frtrace's verdict). Dumps our generator did not write keep their
own semantics this way: what frtrace is checked against is theirs, with a fault.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections import defaultdict
from typing import Optional

KINDS = ("hang", "size", "dtype", "op", "gpu", "skip", "extra", "p2pskip", "p2pstep", "hang2", "gpu2")
# Two culprits at one moment (NVRx starts both faults after one delay): the first's fault at
# its #k, the second's at its first op created at that moment or later, wherever it is.
AT_ONCE = {"hang2": "hang", "gpu2": "gpu"}
_P2P_NAME = re.compile(r"(send|recv) (\d+)(?:->|<-)(\d+)")
_FLIP_DTYPE = {"BFloat16": "Float", "Float": "BFloat16", "Half": "Float", "Long": "Int", "Int": "Long"}


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
    if kind in ("p2pskip", "p2pstep"):
        return _inject_p2p_skip(job, granks, layout, rng, newest=kind == "p2pskip")
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
    if kind in AT_ONCE:
        other = rng.choice([rank for rank in sorted(job) if rank != culprit])
        return inject_at_once(job, AT_ONCE[kind], group, seq, (culprit, other), queued=rng.choice([0, 1, 2, 3]))
    return inject_at(job, kind, group, seq, culprit, queued=rng.choice([0, 1, 2, 3]))


def inject_at_once(job: dict, kind: str, group: str, seq: int, culprits: tuple[int, int], queued: int = 0):
    """A host hang or a GPU that stops reporting (`kind` "hang" or "gpu") on two ranks at
    one moment: the first at its collective #`seq` of `group`, the second at its first
    unit created then or later (time_created_ns, a clock the ranks share), wherever that
    is. None where the second had issued everything before that moment, or where, for a
    GPU, the first's victims held it up before its own GPU stopped (no fault of its shows)."""
    granks = group_ranks(job)
    layout = Layout(job, granks)
    first, second = culprits
    entries = job[first][1]["entries"]
    at = {first: layout.at[first][("C", group, seq)]}
    moment = entries[layout.units[first][at[first]][0]]["time_created_ns"]
    later = [u for u, (start, _, keys) in enumerate(layout.units[second])
             if keys and job[second][1]["entries"][start]["time_created_ns"] >= moment]
    if not later:
        return None
    at[second] = later[0]
    dumps = _stopped(job, layout, granks, kind, set(culprits), at, set(), queued)
    if dumps is None:
        return None
    return dumps, {"group": group, "seq": seq, "culprit": first, "culprits": sorted(culprits), "kind": kind + "2",
                   "members": len(granks[group])}


def inject_at(job: dict, kind: str, group: str, seq: int, culprit: int, queued: int = 0, p2p_status: bool = True):
    """`inject`'s fault of `kind` at collective #`seq` of `group`, by `culprit` (for a GPU
    that stops reporting, with `queued` ops after #seq it only queued). `p2p_status`: P2P
    work moves pg_status, as torch's does; False writes it as producers that count
    collectives only do."""
    granks = group_ranks(job)
    layout = Layout(job, granks)
    key = ("C", group, seq)
    never = {key} if kind in ("size", "dtype", "op") else set()
    if kind in ("skip", "extra"):
        job = _renumbered(job, layout, group, seq, culprit, kind)
        layout = Layout(job, granks)
        for number in {k for r in granks[group] for k in layout.at[r] if k[0] == "C" and k[1] == group and k[2] >= seq}:
            if len({_signature(job, layout, r, number) for r in granks[group] if number in layout.at[r]}) > 1:
                never.add(number)
    at = {culprit: layout.at[culprit][key]} if kind in ("hang", "gpu") else {}
    dumps = _stopped(job, layout, granks, kind, {culprit}, at, never, queued, key, p2p_status)
    if dumps is None:
        return None
    return dumps, {"group": group, "seq": seq, "culprit": culprit, "kind": kind, "members": len(granks[group])}


def _stopped(job: dict, layout: Layout, granks: dict[str, list[int]], kind: str, culprits: set[int],
             at: dict[int, int], never: set, queued: int, key=None, p2p_status: bool = True) -> Optional[dict]:
    """The job's dumps once every rank is cut at the op it blocks in. A hang's or a stalled
    GPU's culprits (`at`: culprit -> the unit its fault is at) keep what they were given:
    a hang's up to that unit (cut, as any rank, at one that cannot finish), a stalled
    GPU's that unit and `queued` after it, unfinished. None where a stalled GPU's rank
    blocks before its stall (in an op a rank held up by another culprit never reached)."""
    reached = {rank: len(layout.units[rank]) for rank in job}
    for rank, unit in at.items():
        reached[rank] = unit + (1 if kind == "gpu" else 0)
    # A host that stopped issuing still waits in what it issued before that cannot finish
    # (an op the other culprit never issued); so does a stalled GPU, in an op before its
    # stall that a rank held up by the other culprit never reached. Else its ops from the
    # stall on are marked by _stalled.
    blocked = _settle(job, layout, granks, reached, never)
    if kind == "gpu" and any(reached[rank] < unit + 1 for rank, unit in at.items()):
        return None  # a culprit was held up before its GPU stopped: no fault of its own shows
    dumps = {}
    for rank, (name, dump) in job.items():
        if kind == "gpu" and rank in at:
            dumps[rank] = (name, _stalled(dump, layout.units[rank], at[rank], queued, p2p_status))
        else:
            dumps[rank] = (name, _cut(dump, layout.units[rank], reached[rank], rank in blocked, key, rank in culprits,
                                      kind, p2p_status))
    return dumps


def _inject_p2p_skip(job, granks, layout, rng, newest=True):
    """`newest`: a unit newest on each of its channels (counted from the newest: 1), so no
    later op on the channel meets what the skipped one should have (NCCL pairs in order);
    else a unit in the newer half of the rank's P2P units, not its last: a step of the
    program left out, the later ones paired by their place in it (as the independent
    generators write a skipped ring step)."""
    candidates = []
    for rank in sorted(job):
        p2p = [u for u, (_, _, keys) in enumerate(layout.units[rank]) if keys and keys[0][0] == "P"]
        if newest:
            candidates += [(rank, u) for u in p2p if all(key[4] == 1 for key in layout.units[rank][u][2])]
        elif len(p2p) >= 4:
            candidates += [(rank, u) for u in p2p[len(p2p) // 2:-1]]
    if not candidates:
        return None
    culprit, unit = rng.choice(candidates)
    dumps, what = skip_p2p_at(job, culprit, unit)
    return dumps, dict(what, kind="p2pskip" if newest else "p2pstep")


def skip_p2p_at(job: dict, culprit: int, unit: int):
    """The job with the culprit's P2P unit number `unit` (a plain op or a whole batch: a
    ring step's send and recv) left out, its later P2P numbers in the group one less. The
    peers' ops that unit would have met never finish; the culprit goes on, its later ops
    meeting what they met before (`inject` picks a unit newest on its channels, so no
    later op of the culprit there takes the left-out op's partner, as NCCL's in-order
    pairing would), and blocks where a peer no longer gets there."""
    granks = group_ranks(job)
    layout = Layout(job, granks)
    first, end, keys = layout.units[culprit][unit]
    name, dump = job[culprit]
    dump = copy.deepcopy(dump)
    entries = dump["entries"]
    group, number = entries[first]["process_group"][0], entries[first]["p2p_seq_id"]
    removed = end - first
    for entry in entries[end:]:
        entry["record_id"] -= removed
        if entry["process_group"][0] == group:
            entry["p2p_seq_id"] -= 1
    dump["entries"] = entries[:first] + entries[end:]
    job = {**job, culprit: (name, dump)}
    units = layout.units[culprit]
    layout.units[culprit] = units[:unit] + [(f - removed, e - removed, k) for f, e, k in units[unit + 1:]]
    layout.at[culprit] = {key: u for u, (_, _, unit_keys) in enumerate(layout.units[culprit]) for key in unit_keys}
    reached = {rank: len(layout.units[rank]) for rank in job}
    blocked = _settle(job, layout, granks, reached, set(keys))
    dumps = {rank: (rank_name, _cut(rank_dump, layout.units[rank], reached[rank], rank in blocked, None, False,
                                    "p2pskip"))
             for rank, (rank_name, rank_dump) in job.items()}
    return dumps, {"group": group, "seq": number, "culprit": culprit, "kind": "p2pskip",
                   "members": len(granks[group])}


def _settle(job, layout, granks, reached, never):
    """Cut each rank's units at the first one that cannot finish (kept: it is blocked in
    it), until nothing changes. Returns the ranks blocked."""
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

    blocked = set()
    changed = True
    while changed:
        changed = False
        for rank in job:
            for u in range(reached[rank]):
                if not all(can_finish(rank, key) for key in layout.units[rank][u][2]):
                    blocked.add(rank)
                    if u + 1 < reached[rank]:
                        reached[rank], changed = u + 1, True
                    break
    return blocked


def _unfinished(entries, first, end, started):
    """Mark a unit unfinished: `started` where the job records start events (timing on)."""
    timed = any(entry.get("time_discovered_started_ns") for entry in entries)
    for entry in entries[first:end]:
        batch_op = entry["is_p2p"] and end - first > 1
        entry["state"] = "started" if started and timed and not batch_op else "scheduled"
        entry["time_discovered_completed_ns"] = None
        if not started:
            entry["time_discovered_started_ns"] = None
        if "duration_ms" in entry:
            entry["duration_ms"] = None
        entry["retired"] = False


def _cut(dump, units, kept, blocked, key, is_culprit, kind, p2p_status=True):
    dump = copy.deepcopy(dump)
    cut = units[kept - 1][1] if kept else 0
    dropped, dump["entries"] = dump["entries"][cut:], dump["entries"][:cut]
    last_holds_fault = kept and key in units[kept - 1][2]
    if kept and blocked:
        first, end, _ = units[kept - 1]
        _unfinished(dump["entries"], first, end, True)
        if is_culprit and kind in ("size", "dtype", "op") and last_holds_fault:
            _alter(dump["entries"][first], kind)
    return _with_status(dump, dropped, p2p_status)


def _alter(entry, kind):
    if kind == "size":
        for field in ("input_sizes", "output_sizes"):
            entry[field] = [[shape[0] + 1, *shape[1:]] if shape else [1] for shape in entry[field]]
    elif kind == "dtype":
        for field in ("input_dtypes", "output_dtypes"):
            entry[field] = [_FLIP_DTYPE.get(dtype, "Float") for dtype in entry[field]]
    else:
        entry["profiling_name"] = "nccl:all_reduce" if "broadcast" in entry["profiling_name"] else "nccl:broadcast"


def _stalled(dump, units, at, queued, p2p_status=True):
    dump = copy.deepcopy(dump)
    kept = min(len(units), at + 1 + queued)
    cut = units[kept - 1][1]
    dropped, dump["entries"] = dump["entries"][cut:], dump["entries"][:cut]
    for u in range(at, kept):
        first, end, _ = units[u]
        _unfinished(dump["entries"], first, end, u == at)
    return _with_status(dump, dropped, p2p_status)


def _with_status(dump, dropped, p2p_status=True):
    """pg_status from the kept entries, numbered as torch numbers it: each work (a
    collective, a plain P2P op, a batch's marker) carries its own sequence number, a P2P
    number for P2P work and a collective number otherwise. Enqueued is the newest work
    kept, started the newest that started, completed the newest that finished before the
    oldest unfinished one (or, with none finished before it, the number before it). With
    none of the group's work kept, all three are the number before the first dropped.
    Without `p2p_status` only collectives count."""
    group_of_pg = {}
    for entry in dump["entries"] + dropped:
        group_of_pg.setdefault(str(entry["pg_id"]), entry["process_group"][0])
    for pg_id, status in (dump.get("pg_status") or {}).items():
        group = group_of_pg.get(str(pg_id))
        if group is None:
            continue
        kept = _works(dump["entries"], group, p2p_status)
        if kept:
            enqueued = kept[-1][0]
            started = next((seq for seq, state in reversed(kept) if state in ("started", "completed")), None)
            unfinished = next((k for k, (_, state) in enumerate(kept) if state != "completed"), None)
            if unfinished is None:
                completed = enqueued
            else:
                done = [seq for seq, state in kept[:unfinished] if state == "completed"]
                completed = done[-1] if done else kept[unfinished][0] - 1
            started = completed if started is None else started
        else:
            later = _works(dropped, group, p2p_status)
            if not later:
                continue
            enqueued = completed = started = later[0][0] - 1
        if status.get("last_started_collective") == -1:  # timing off: torch leaves it so
            started = -1
        status.update(last_enqueued_collective=enqueued, last_started_collective=started,
                      last_completed_collective=completed)
    return dump


def _works(entries, group, p2p_status=True):
    """(sequence number, state) of each work of `group` in `entries`, in order: a batch's
    ops carry no state of their own (their marker does), so only its marker counts.
    Without `p2p_status`, collectives only."""
    works = []
    for first, end, _ in units_of(entries):
        unit = [e for e in entries[first:end] if e["process_group"][0] == group]
        if not unit:
            continue
        last = unit[-1]
        if last["is_p2p"] or (last["profiling_name"].endswith(":coalesced") and any(e["is_p2p"] for e in unit)):
            if p2p_status:
                works.append((last["p2p_seq_id"], last["state"]))
        else:
            works.append((last["collective_seq_id"], last["state"]))
    return works


def dumped_at(job: dict, moments: dict[int, int], polled_ns: int = 0) -> dict:
    """The job as each rank's dump reads when taken at its own moment (`moments`: rank -> ns
    on its clock; a rank not named keeps its dump): ops created later are left out, and ops
    seen to start or finish later have not yet. A job dumped by hand while it ran is so,
    each rank a few milliseconds from the others. In pg_status, what started and finished
    is the watchdog's, from its last poll `polled_ns` before the dump (the dump asks each
    op's events itself); what was enqueued, the host's, is as of the dump."""
    out = dict(job)
    for rank, moment in moments.items():
        name, dump = job[rank]
        out[rank] = (name, _as_dumped_at(dump, moment, moment - polled_ns))
    return out


def _as_dumped_at(dump: dict, moment: int, polled: int) -> dict:
    at_poll = _as_seen_until(dump, polled)
    dump = _as_seen_until(dump, moment)
    for pg_id, status in dump.get("pg_status", {}).items():
        polled_status = at_poll.get("pg_status", {}).get(pg_id, status)
        status.update(last_started_collective=polled_status["last_started_collective"],
                      last_completed_collective=polled_status["last_completed_collective"])
    return dump


def _as_seen_until(dump: dict, moment: int) -> dict:
    dump = copy.deepcopy(dump)
    entries = dump["entries"]
    dump["entries"] = [e for e in entries if e["time_created_ns"] <= moment]
    for entry in dump["entries"]:
        _as_seen_at(entry, moment)
    return _with_status(dump, entries[len(dump["entries"]):])


def _as_seen_at(entry: dict, moment: int) -> None:
    completed = entry.get("time_discovered_completed_ns")
    if completed is None or completed <= moment:
        return
    started = entry.get("time_discovered_started_ns")
    entry.update(time_discovered_completed_ns=None, duration_ms=None, retired=False)
    if started is not None and started > moment:
        entry["time_discovered_started_ns"] = None
    entry["state"] = "started" if entry.get("time_discovered_started_ns") is not None else "scheduled"


def batches_numbered_as_collectives(dumps: dict) -> dict:
    """rank -> dump dict, numbered as torch builds whose `startCoalescing` bumps the
    collective counter number them: in a group that posts its P2P work in batches, every
    entry's collective number grows by its P2P number (each batch took a collective number
    of its own). For dumps of batches only, whose markers close P2P ops."""
    batching: set[str] = set()
    for dump in dumps.values():
        entries = dump["entries"]
        batching.update(entry["process_group"][0] for before, entry in zip(entries, entries[1:])
                        if entry["profiling_name"].endswith(":coalesced") and before["is_p2p"])
    out = {}
    for rank, dump in dumps.items():
        dump = copy.deepcopy(dump)
        for entry in dump["entries"]:
            if entry["process_group"][0] in batching:
                entry["collective_seq_id"] += entry["p2p_seq_id"]
        out[rank] = dump
    return out


def only_active(dumps: dict) -> dict:
    """The dumps as onlyActive writes them: finished entries left out."""
    return {rank: (name, {**dump, "entries": [e for e in dump["entries"] if e["state"] != "completed"]})
            for rank, (name, dump) in dumps.items()}


def wrapped(dumps: dict) -> dict:
    """Each rank's ring keeping 50 to 100 % of its entries, the newest (by rank, repeatably)."""
    out = {}
    for rank, (name, dump) in dumps.items():
        entries = dump["entries"]
        keep = int(len(entries) * (0.5 + 0.5 * ((rank * 7919) % 97) / 97))
        out[rank] = (name, {**dump, "entries": entries[len(entries) - keep:]})
    return out
