"""Where each rank stands: whether its dumps say when ops finish, the op it is blocked
in, and the ops its host only queued behind that one.

Takes `RankDump`s; returns facts about them (a flag, indexes, trimmed dumps). The
pipeline uses them to hand the diagnosis the entries as each rank's device got them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from frtrace.model import Entry, PgStatus
from frtrace.table.rank_dump import RankDump


def mixes_numberings(status: PgStatus) -> bool:
    """pg_status holds the sequence number of a group's last enqueued and last finished
    work, each a P2P number after P2P work and a collective number after a collective.
    More finished than enqueued cannot be in one numbering: the pending last work is of
    one kind, the last finished of the other, and neither can be read against entries."""
    return (status.last_enqueued is not None and status.last_completed is not None
            and status.last_completed > status.last_enqueued)


def completion_is_reliable(dumps: Sequence[RankDump]) -> bool:
    """gloo never moves entries past `scheduled` and retires even timed-out ops, so
    only producers that report started/completed states tell waiting from finished;
    and so do dumps that keep only active entries, as every entry they hold is unfinished."""
    for dump in dumps:
        for entry in dump.entries:
            if entry.state in ("started", "completed") or entry.time_completed_ns:
                return True
    return only_active_job(dumps)


def keeps_only_active(dump: RankDump) -> bool:
    """The dump was taken with only active entries (`onlyActive`, as NVRx and Megatron
    set it): finished entries were left out, which shows as gaps in its record ids (a
    ring buffer drops only its oldest). gloo's states say nothing, so never gloo's; and the
    CUPTI monitor's record ids are correlation ids, whose gaps say nothing."""
    entries = dump.entries
    if not entries or dump.unreadable_entries or dump.writer != "c10d":
        return False
    gaps = entries.value("record_id", len(entries) - 1) - entries.value("record_id", 0) + 1 > len(entries)
    if not gaps and not status_past_held_work(dump):
        return False
    return dump.backend != "gloo"  # the backend last: it is read off every op name


def status_past_held_work(dump: RankDump) -> bool:
    """pg_status says some group enqueued and finished work newer than every op of it the
    dump holds, and the dump holds none of that work: its finished entries were left out,
    though the records it kept happen to run without a gap (a few stale ops of batches,
    which never look finished). A ring buffer keeps every record newer than one it holds,
    so in a full dump a group's last work is among its entries: a collective number (then
    no entry of the group is numbered past it) or a P2P one (then a P2P entry holds it).
    Finished work, not merely enqueued work, so that work enqueued while the dump was
    taken cannot pass for it. Only dumps holding nothing finished are read: a full dump of
    a job that ran holds finished work."""
    entries = dump.entries
    # The oldest entry first: in a full dump it finished as a rule, and that settles it
    # without reading every entry's code (this runs for every gapless dump, in the workers).
    if not dump.pg_status or entries.static_row(0).state == "completed":
        return False
    if _holds_finished(dump):
        return False
    newest_collective: dict[int, int] = {}
    newest_p2p: dict[int, int] = {}
    for row, (pg_id, collective, p2p) in enumerate(zip(entries.field("pg_id"), entries.field("collective_seq_id"),
                                                       entries.field("p2p_seq_id"))):
        if isinstance(collective, int):
            newest_collective[pg_id] = max(collective, newest_collective.get(pg_id, collective))
        if isinstance(p2p, int) and entries.static_row(row).name.is_p2p:
            newest_p2p[pg_id] = max(p2p, newest_p2p.get(pg_id, p2p))
    for pg_id, held in newest_collective.items():
        status = dump.pg_status.get(pg_id)
        if status is None or status.last_completed is None or status.last_completed != status.last_enqueued:
            continue
        if status.last_completed > held and status.last_completed != newest_p2p.get(pg_id):
            return True
    return False


def only_active_job(dumps: Sequence[RankDump]) -> bool:
    """The job's dumps keep only active entries: a job-wide setting, so one dump showing it
    (gaps in its record ids) speaks for all, even those whose few entries show no gap; and
    so do wrapped dumps whose sizes no ring buffer has (`sizes_say_only_active`)."""
    return any(map(keeps_only_active, dumps)) or sizes_say_only_active(dumps)


# torch keeps 2,000 entries by default (TORCH_NCCL_TRACE_BUFFER_SIZE); jobs that change it
# raise it. Wrapped dumps all holding fewer, none of them anything finished, are not rings.
SMALLEST_RING = 64


def sizes_say_only_active(dumps: Sequence[RankDump]) -> bool:
    """Dumps that start past record 0 each hold as many entries as the ring buffer does
    (TORCH_NCCL_TRACE_BUFFER_SIZE, set for the whole job): wrapped dumps holding different
    numbers of entries, or all fewer than SMALLEST_RING, while no dump of the job holds
    anything finished, kept only their active entries. Each may still be one run of
    records with no gap: a rank's op and those its host queued behind it."""
    sizes = {len(dump.entries) for dump in dumps
             if dump.entries and not dump.unreadable_entries and dump.writer == "c10d"
             and dump.entries.value("record_id", 0) > 0}
    if not sizes or (len(sizes) == 1 and max(sizes) >= SMALLEST_RING):
        return False
    # The backend last: it is read off every op name.
    return (not any(dump.backend == "gloo" for dump in dumps if dump.entries)
            and not any(_holds_finished(dump) for dump in dumps if dump.entries))


def _holds_finished(dump: RankDump) -> bool:
    """Some entry of the dump says its op completed (read off the distinct static rows)."""
    return any(static.state == "completed" for static in dump.entries.statics_in_use())


def blocked_at(entries: Sequence[Entry]) -> int:
    """Index of the entry the rank is blocked in (len(entries) when it is in none): the
    oldest unfinished entry after the newest completed one. A rank's ops finish in the
    order it enqueued them, so an older unfinished entry followed by completed ones is
    stale, not where it waits."""
    start = len(entries)
    while start > 0 and not entries[start - 1].completed:
        start -= 1
    return start


def batch_key(entry: Entry) -> tuple[str, bool, int]:
    """What the entries of one coalesced batch share."""
    return entry.pg_name, entry.is_p2p, entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id


def queued_behind(entries: Sequence[Entry]) -> int:
    """How many entries the rank's host queued behind the op it is blocked in, the rest
    of that op's batch left out (0 when it is blocked in none)."""
    blocked = blocked_at(entries)
    if blocked >= len(entries) - 1:
        return 0
    batch = batch_key(entries[blocked])
    return sum(batch_key(entries[i]) != batch for i in range(blocked + 1, len(entries)))


def without_queued_ops(dump: RankDump) -> RankDump:
    """The dump as the rank's GPU got it: without the ops the host only queued behind
    the one the rank is blocked in. The host enqueues ahead, so a stuck rank may list
    its next ops as `scheduled`; they have not reached the network, and counting them
    as issued makes peers look waiting in an op nobody entered (a false `stuck`) or a
    merely queued send look posted. An op that has started (timing on) is running and
    stays, and so does the rest of the blocked op's own batch. Returns `dump` itself
    when nothing is queued."""
    entries = dump.entries
    blocked = blocked_at(entries)
    if blocked >= len(entries) - 1:
        return dump
    batch = batch_key(entries[blocked])
    behind = [i for i in range(blocked + 1, len(entries)) if entries[i].started or batch_key(entries[i]) == batch]
    if len(behind) == len(entries) - blocked - 1:
        return dump
    return replace(dump, entries=entries.take([*range(blocked + 1), *behind]))


def blocked_entries(dumps: Sequence[RankDump]) -> dict[int, Entry]:
    """rank -> the entry of the op the rank is blocked in (where it waits now), for the
    ranks of `dumps` blocked in one."""
    blocked = {}
    for dump in dumps:
        position = blocked_at(dump.entries)
        if position < len(dump.entries):
            blocked[dump.rank] = dump.entries[position]
    return blocked
