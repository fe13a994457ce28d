"""Dumps written by PyTorch's CUPTI comms monitor, read as the c10d Flight Recorder's.

Takes one decoded dump; says whether the CUPTI comms monitor wrote it
(`torch.profiler._cupti.comms.FlightRecorderPlugin`, pytorch#187519), and returns it in the
shape the rest of the loader reads, with the clock its times are on. What sets those dumps
apart, from the plugin's source:

* every entry carries `process_group_ranks` (the group's global ranks; no other writer does),
  `process_group` is a list `[name, desc]` (desc often ""), `pg_id` is 0 for every group, and
  there is no `thread_id`, `thread_name` or, unless asked for, `frames`;
* `collective_seq_id` is NCCL's own counter (the profiler plugin's `seq`), which NCCL keeps
  per communicator *and per collective type*, from 0: an all_reduce and an all_gather of one
  group can both be #3. Each op type of a group is therefore lined up on its own, under the
  name `<group>/<op>`. Sends and receives carry neither a sequence number nor their peer
  (the NCCL plugin does not describe P2P), so nothing can pair them;
* `record_id` is the collective's external-correlation id, shared with every other pushed
  id of the process, so its gaps mean nothing (they are not an only-active dump's gaps), and
  for a collective captured in a CUDA graph it is the kernel's graph node id, in no order:
  the ids are kept where they rise in the file's order (so `frtrace diff` can follow a rank
  from one dump to the next), else entries are numbered in their order. Whether the window
  is clipped is read off the sequence numbers instead: it is not when every op type of
  every group starts at the dump's first number (nothing fell off the plugin's ring, and
  it watched from the start); else what a rank does not hold before its first entry is
  unknown, not "never issued";
* `pg_config` is built from the entries, and `pg_status` holds group "0" only, with the
  largest sequence number enqueued or completed across *all* groups: no group's status, so
  it is not read;
* a collective still in flight is `scheduled` with `time_created_ns` 0; a finished one
  carries its kernel's start and end as `time_created_ns` / `time_discovered_*_ns`, on
  CUPTI's own clock unless the plugin was given a clock converter (then Unix ns). `clock`
  says which: times that are no plausible Unix time are CUPTI's native clock, which each
  host (GPU) counts from its own origin, so they cannot be compared across ranks;
* `timeout_ms` is 0 when the backend did not say: unknown.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from frtrace.load.safe_decode import RawDump, RawValue

WRITER = "cupti_monitor"
C10D = "c10d"
# Clocks a dump's times may be on: comparable across ranks (hosts' wall clocks, NTP apart), or
# CUPTI's native timestamps, whose origin differs from host to host.
WALL_CLOCK = "wall"
CUPTI_CLOCK = "cupti"
# Unix time in ns from 2001-09-09 to 2100: what a wall clock (or a converted CUPTI time) reads.
# CUPTI's native clock counts from an origin of its own (around boot), far below that.
_PLAUSIBLE_UNIX_NS = (10**18, 4_102_444_800 * 10**9)
_TIME_FIELDS = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


def is_monitor_dump(raw: RawDump) -> bool:
    """Whether the CUPTI comms monitor wrote this decoded dump (its entries carry
    `process_group_ranks`)."""
    entries = raw.get("entries")
    if not isinstance(entries, list):
        return False
    return any(isinstance(entry, dict) and "process_group_ranks" in entry for entry in entries[:16])


class Adapted(NamedTuple):
    dump: RawDump  # in c10d's shape
    clock: str  # WALL_CLOCK or CUPTI_CLOCK
    clipped: bool  # the window may not reach back to the job's first ops


def as_c10d(raw: RawDump) -> Adapted:
    """The dump in c10d's shape, the clock of its times, and whether its window is clipped,
    for a dump `is_monitor_dump` accepts. Entries that are not dicts are left for the
    normaliser to reject."""
    entries = raw["entries"]
    config: dict[str, dict[str, str]] = {}
    first_seq: dict[str, RawValue] = {}  # stream name -> its first collective_seq_id
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        name, desc = _group_of(entry.get("process_group"))
        if entry.get("is_p2p") is not True:
            name = f"{name}/{_op_of(entry.get('profiling_name'))}"
            first_seq.setdefault(name, entry.get("collective_seq_id"))
        entry["process_group"] = [name, desc]
        ranks = entry.pop("process_group_ranks", None)
        config.setdefault(name, {"name": name, "desc": desc, "ranks": _ranks_text(ranks)})
        if entry.get("timeout_ms") == 0:
            entry["timeout_ms"] = None
    dicts = [entry for entry in entries if isinstance(entry, dict)]
    ids = [i for i in (entry.get("record_id") for entry in dicts) if type(i) is int]
    if len(ids) < len(dicts) or any(a >= b for a, b in zip(ids, ids[1:])):
        for number, entry in enumerate(dicts):
            entry["record_id"] = number
    adapted = {key: value for key, value in raw.items() if key not in ("pg_config", "pg_status")}
    adapted["pg_config"] = config
    return Adapted(adapted, _clock_of(entries), not _from_the_start(first_seq.values()))


def _from_the_start(firsts: Iterable[RawValue]) -> bool:
    """Whether every stream's first number is the lowest any holds (0 for NCCL's counters):
    then no stream lost its oldest ops."""
    numbers = list(firsts)
    if not all(type(n) is int for n in numbers):
        return False
    return not numbers or len(set(numbers)) == 1 and numbers[0] <= 1


def _group_of(pg: RawValue) -> tuple[str, str]:
    """(name, desc) from the entry's `[name, desc]`; odd values are kept for the normaliser
    to warn about, under a name no real group has."""
    if isinstance(pg, (list, tuple)) and pg and all(isinstance(part, str) for part in pg[:2]):
        return pg[0], pg[1] if len(pg) > 1 else ""
    return "?", ""


def _op_of(profiling_name: RawValue) -> str:
    if not isinstance(profiling_name, str):
        return "?"
    return profiling_name.partition(":")[2].strip().split(" ", 1)[0] or profiling_name


def _ranks_text(ranks: RawValue) -> str:
    """pg_config's rank list as c10d writes it (`"[0, 1]"`); "[]" when the entry does not say."""
    if isinstance(ranks, (list, tuple)) and all(type(r) is int for r in ranks):
        return str(list(ranks))
    return "[]"


def _clock_of(entries: list[RawValue]) -> str:
    """WALL_CLOCK when every time the dump holds is a plausible Unix time (the plugin was
    given a clock converter), else CUPTI_CLOCK. A dump with no time at all says nothing
    either way and counts as wall clock."""
    low, high = _PLAUSIBLE_UNIX_NS
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        for field in _TIME_FIELDS:
            value = entry.get(field)
            if type(value) is int and value and not low <= value < high:
                return CUPTI_CLOCK
    return WALL_CLOCK
