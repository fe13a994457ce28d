"""Coalesced batches as the units they are.

Takes a rank's entries (oldest first); returns them with every batch settled. Inside a
coalesced batch (`batch_isend_irecv`, or collectives issued under one coalescing
manager) torch records each op with no events of its own, so its entry stays
`scheduled` forever; the end marker (`nccl:coalesced`, `ALLGATHER_coalesced`, ...) is
the batch's real work and the only entry whose state advances. Each op of a batch
takes the marker's state here, and the marker of a P2P batch (`is_p2p` False, carrying
the group's current `collective_seq_id`, which belongs to an earlier collective) is
filed with its batch's P2P ops: it is not a collective.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from itertools import chain, compress, islice, repeat
from typing import Callable, Container, Optional, Sequence

from frtrace.model import Entry, OpName, PgStatus, says_more_than_scheduled
from frtrace.table.entry_table import BatchFacts, EntryTable, StaticRow, Value
from frtrace.table.standing import batch_key, mixes_numberings

_IS_MARKER = operator.attrgetter("name.is_coalesced_marker")


# The fields each op of a batch takes from its end marker.
SETTLED_FIELDS = ("state", "retired", "time_started_ns", "time_completed_ns", "duration_ms")


def batch_settlements(entries: Sequence[Entry]) -> dict[int, Entry]:
    """position -> the settled entry, for every entry a batch changes (Entry tuples:
    `settle_table_batches` does the same to an EntryTable's columns)."""
    facts = functools.partial(_facts_of, entries)
    changes: dict[int, Entry] = {}
    p2p_names: dict[OpName, OpName] = {}  # one shared renamed marker name per distinct name
    for position in compress(range(len(entries)), map(_IS_MARKER, entries)):
        start = _batch_start(facts, position)
        marker = entries[position]
        if start == position:
            # A marker with no ops before it: they fell off the ring buffer. Where it is
            # its group's oldest entry, it is filed as no collective (see _orphan_markers).
            if not any(entry.pg_name == marker.pg_name for entry in entries[:position]):
                changes[position] = marker._replace(name=p2p_names.setdefault(marker.name, marker.name._replace(is_p2p=True)))
            continue
        if facts(start)[2][1]:  # the batch's ops are P2P
            name = p2p_names.setdefault(marker.name, marker.name._replace(is_p2p=True))
            changes[position] = marker = marker._replace(name=name)
        for i in range(start, position):
            if not _has_own_state(entries[i]):
                changes[i] = entries[i]._replace(**{field: getattr(marker, field) for field in SETTLED_FIELDS})
    return changes


def settle_table_batches(table: EntryTable) -> bool:
    """Settle every batch of a rank's table in place, as `batch_settlements` settles
    Entry tuples, reading and writing its columns (in a job of batched P2P, half of a
    rank's entries are a batch's ops); whether anything changed."""
    marker_codes = {code for code, static in enumerate(table.statics) if static.name.is_coalesced_marker}
    if not marker_codes:
        return False
    markers = _rows_holding(table.codes, marker_codes)
    statics, codes = table.statics, table.codes
    starts = _batch_starts(table, markers)
    # Each batch's ops, and the marker each takes its state from, laid out in C. A marker
    # with no ops before it (they fell off the ring buffer) has none, and is left be.
    ops = list(chain.from_iterable(map(range, starts, markers)))
    their_markers = list(chain.from_iterable(map(repeat, markers, map(operator.sub, markers, starts))))
    # The markers closing a batch whose ops are P2P (its first op's flag, read off its code).
    p2p_of_code = [static.name.is_p2p for static in statics]
    closes_p2p = map(operator.and_, map(operator.ne, starts, markers), map(p2p_of_code.__getitem__, map(codes.__getitem__, starts)))
    p2p_markers = sorted(list(compress(markers, closes_p2p)) + _orphan_markers(table, markers, starts))
    # Only an op whose state (a static field, judged once per static row) is `scheduled`
    # can lack events of its own: the other fields are read for those alone.
    scheduled = [static.state == "scheduled" for static in statics]
    is_scheduled = list(map(scheduled.__getitem__, map(codes.__getitem__, ops)))
    waiting, waiting_markers = list(compress(ops, is_scheduled)), list(compress(their_markers, is_scheduled))
    states = [table.field_at(name, waiting) for name in ("state", "retired", "time_started_ns", "time_completed_ns")]
    unsettled = list(map(operator.not_, map(says_more_than_scheduled, *states)))
    table.copy_fields(list(compress(waiting, unsettled)), list(compress(waiting_markers, unsettled)), SETTLED_FIELDS)
    p2p_names: dict[OpName, OpName] = {}
    names = [p2p_names.setdefault(name, name._replace(is_p2p=True)) for name in table.field_at("name", p2p_markers)]
    table.set_static(p2p_markers, "name", names)
    return bool(ops or p2p_markers)


def _orphan_markers(table: EntryTable, markers: Sequence[int], starts: Sequence[int]) -> list[int]:
    """The markers with no ops before them that are their group's oldest entry: the ring
    buffer overwrote their batch's ops. Nothing shows what op they ended (a P2P batch's
    marker carries the number of the group's last collective), so they are filed as no
    collective: compared as one, a P2P batch's marker read as a mismatch with the
    collective its peers issued under that number (a FAULT on a healthy job)."""
    groups, codes = [static.pg_name for static in table.statics], table.codes
    orphans = []
    for position in compress(markers, map(operator.eq, markers, starts)):  # as a rule, none
        group = groups[codes[position]]
        if not any(groups[codes[row]] == group for row in range(position)):
            orphans.append(position)
    return orphans


def batch_at_the_cut(table: EntryTable) -> Optional[tuple[str, int]]:
    """(pg name, number) of the coalesced batch of collectives that begins at the table's
    first row, or None. In a ring that wrapped, the first row is where the ring cut, one
    record at a time: such a batch may have lost its first ops (each rank's ring wraps at
    its own point), as an orphan marker (`_orphan_markers`) lost them all."""
    codes, statics = table.codes, table.statics
    first = statics[codes[0]] if codes else None
    if first is None or first.name.is_p2p or first.name.is_coalesced_marker:
        return None
    marker_codes = [code for code, static in enumerate(statics) if static.name.is_coalesced_marker]
    found = [codes.index(code) for code in marker_codes if code in codes]
    if not found or _batch_starts(table, [min(found)]) != [0]:
        return None
    return first.pg_name, table.value("collective_seq_id", 0)


def _rows_holding(codes: Sequence[int], wanted: set[int]) -> list[int]:
    """The rows whose code is in `wanted`, in order: each found by the array's own search
    in C, from the last (markers are one row in ten or so; testing each row costs more)."""
    rows: list[int] = []
    for code in wanted:
        at = -1
        try:
            while True:
                at = codes.index(code, at + 1)
                rows.append(at)
        except ValueError:
            pass
    return sorted(rows) if len(wanted) > 1 else rows


def _batch_starts(table: EntryTable, markers: Sequence[int]) -> list[int]:
    """`_batch_start` of each marker row of `markers`, read off the table's codes and
    sequence number columns (settling is half of what the loader does after decoding,
    when half of a rank's entries are batched): a row's group, P2P flag and marker flag
    come with its code, and a run stops at the first row whose code or number differs."""
    statics, codes = table.statics, table.codes
    # A number per (group, P2P flag) a code holds; in the runs of a collective batch, which
    # markers end, a marker's code counts as no kind (-1).
    kind_numbers: dict[tuple[str, bool], int] = {}
    kinds = [kind_numbers.setdefault((static.pg_name, static.name.is_p2p), len(kind_numbers)) for static in statics]
    collective_kinds = [-1 if static.name.is_coalesced_marker else kind for static, kind in zip(statics, kinds)]
    groups = [static.pg_name for static in statics]
    p2p = [static.name.is_p2p for static in statics]
    collective_seq, p2p_seq = table.number_readers()
    starts = []
    for position in markers:
        start = position
        before = codes[position - 1] if position else 0
        if position and groups[before] == groups[codes[position]] and collective_kinds[before] >= 0:
            # A P2P batch: the run under the previous op's P2P number, markers included; a
            # collective batch: the run of collectives under the marker's own number.
            if p2p[before]:
                run_kinds, numbers, number = kinds, p2p_seq, p2p_seq(position - 1)
            else:
                run_kinds, numbers, number = collective_kinds, collective_seq, collective_seq(position)
            kind = kinds[before]
            while start and run_kinds[codes[start - 1]] == kind and numbers(start - 1) == number:
                start -= 1
        starts.append(start)
    return starts


def _batch_starts_plain(table: EntryTable, markers: Sequence[int]) -> list[int]:
    """_batch_starts' plain twin: each marker's batch found through `batch_facts`."""
    facts = table.batch_facts_reader()
    return [_batch_start(facts, position) for position in markers]


def batch_facts(entry: Entry) -> BatchFacts:
    """What finding a batch's bounds reads of an entry: (pg_name, is it a batch's end
    marker, its batch_key, its collective_seq_id). EntryTable.batch_facts_reader reads the same
    off the columns."""
    return entry.pg_name, entry.name.is_coalesced_marker, batch_key(entry), entry.collective_seq_id


def _facts_of(entries: Sequence[Entry], position: int) -> BatchFacts:
    return batch_facts(entries[position])


def batch_start(entries: Sequence[Entry], position: int) -> int:
    """Where the batch the marker at `position` closes begins: the run of entries just
    before it in the marker's group that share one P2P sequence number (a P2P batch) or
    the marker's collective sequence number (a collective batch)."""
    return _batch_start(functools.partial(_facts_of, entries), position)


def _batch_start(facts: Callable[[int], BatchFacts], position: int) -> int:
    if position == 0:
        return position
    marker_pg, _, _, marker_seq = facts(position)
    pg, is_marker, key, _ = facts(position - 1)
    if pg != marker_pg or is_marker:
        return position
    # A P2P batch is the run of ops under the previous op's P2P number; a collective
    # batch the run of collectives (not markers) under the marker's own number.
    wanted, markers_end_it = (key, False) if key[1] else ((marker_pg, False, marker_seq), True)
    start = position
    while start > 0:
        _, is_marker, key, _ = facts(start - 1)
        if key != wanted or (markers_end_it and is_marker):
            break
        start -= 1
    return start


def _has_own_state(entry: Entry) -> bool:
    """The op's entry says more than `scheduled` (producers that record each op's events)."""
    return says_more_than_scheduled(entry.state, entry.retired, entry.time_started_ns, entry.time_completed_ns)


def finished_settlements(entries: Sequence[Entry], pg_status: dict[int, PgStatus]) -> dict[int, Entry]:
    """A dump that keeps only active entries still holds the ops of batches that finished:
    recorded without events, they never look finished, and their marker, which did, was
    left out. Such ops are marked retired where the dump shows it: a P2P batch of two or
    more ops whose marker (the record right after them) is gone; or pg_status, which says
    how far each group got, is past them. pg_status holds the sequence number of the
    group's last work: a P2P number after P2P work, a collective number after a
    collective (see `_counts_collectives`). A collective number past the one an op was
    issued under says a later collective of the group finished, and the group's work
    finishes in order. Returns position -> the settled entry, for the entries it changes."""
    entries = tuple(entries)  # read several times over: built once from a table
    changes = {i: entries[i]._replace(retired=True) for i in _ops_of_finished_batches(entries)}
    p2p_seqs: dict[int, list[int]] = {}
    collective_seqs: dict[int, list[int]] = {}
    for entry in entries:  # one pass: a dump holds few groups and many entries
        if entry.is_p2p:
            p2p_seqs.setdefault(entry.pg_id, []).append(entry.p2p_seq_id)
        else:
            collective_seqs.setdefault(entry.pg_id, []).append(entry.collective_seq_id)
    counts_collectives = {pg_id: _counts_collectives(status, p2p_seqs.get(pg_id, []), collective_seqs.get(pg_id, []))
                          for pg_id, status in pg_status.items()}
    for i, entry in enumerate(entries):
        entry = changes.get(i, entry)
        status = pg_status.get(entry.pg_id)
        if entry.completed or status is None or status.last_completed is None:
            continue
        numbering = counts_collectives[entry.pg_id]
        if entry.is_p2p and entry.state == "started":
            # A send or recv that started has events of its own, queried when the dump was
            # taken: held, it had not finished. (A batch's ops have none and never start.)
            # The watchdog retires each finished op as it comes to it, and a group's plain
            # sends and recvs to different peers run on streams of their own: a later one
            # may have finished first, so a higher finished number says nothing of this one.
            # Without timing nothing tells such an op from a batch's (docs/limits.md).
            continue
        if entry.is_p2p and numbering:
            finished = entry.collective_seq_id < status.last_completed
        elif entry.is_p2p:
            finished = entry.p2p_seq_id <= status.last_completed
        else:  # a collective: only when pg_status surely counts collectives
            finished = bool(numbering) and entry.collective_seq_id <= status.last_completed
        if finished:
            changes[i] = entry._replace(retired=True)
    changes.update(_collectives_behind_finished_ones(entries, changes))
    return changes


def _collectives_behind_finished_ones(entries: tuple[Entry, ...], changes: dict[int, Entry]) -> dict[int, Entry]:
    """Position -> settled entry for collectives that never started while a later
    collective of their group, by number, finished: a group's work finishes in order. So
    the last op a ring buffer kept of a batch (its others fell off the ring; none of a
    batch's ops ever looks finished) is read as finished when a later batch of its group
    was, even where pg_status cannot say (a group whose numbering it cannot tell)."""
    newest_finished: dict[int, int] = {}
    for i, entry in enumerate(entries):
        # Settled here, or finished by its own record; not by a `retired` flag alone, which
        # torch's watchdog also sets on an op that timed out.
        finished = i in changes or entry.state == "completed" or bool(entry.time_completed_ns)
        entry = changes.get(i, entry)
        if not entry.is_p2p and finished and isinstance(entry.collective_seq_id, int):
            newest_finished[entry.pg_id] = max(entry.collective_seq_id, newest_finished.get(entry.pg_id, -1))
    settled = {}
    for i, entry in enumerate(entries):
        entry = changes.get(i, entry)
        if (not entry.is_p2p and not entry.name.is_coalesced_marker and isinstance(entry.collective_seq_id, int)
                and entry.collective_seq_id < newest_finished.get(entry.pg_id, -1) and not _has_own_state(entry)):
            settled[i] = entry._replace(retired=True)
    return settled


def _counts_collectives(status: PgStatus, p2p: list[int], collectives: list[int]) -> Optional[bool]:
    """Whether a group's pg_status is in collective numbers (True), P2P numbers (False),
    or cannot be told (None), from the sequence numbers of the group's P2P ops and
    collectives the dump holds. Its last enqueued work is the newest: a number below
    some op the dump holds cannot be in that op's numbering."""
    enqueued = status.last_enqueued
    if mixes_numberings(status) or enqueued is None or not p2p:
        # Without a P2P op held, P2P work may still have been the group's last (the dump
        # of only active entries left it out): the numbering cannot be told.
        return None
    if enqueued < max(p2p):
        return True
    if collectives and enqueued < max(collectives):
        return False
    return None


def _ops_of_finished_batches(entries: Sequence[Entry]) -> list[int]:
    """Positions of the ops of batches (two or more ops under one p2p_seq_id, or one
    collective_seq_id, of a group; no marker held) whose marker's record, the one right
    after their last op, is gone: a plain op of its own records its own end, so two
    ops under one number are a batch."""
    held = {e.record_id for e in entries}
    batches: dict[tuple[str, bool, int], list[int]] = {}
    marked: set[tuple[str, bool, int]] = set()
    for i, entry in enumerate(entries):
        key = (entry.pg_name, entry.is_p2p, entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id)
        if entry.name.is_coalesced_marker:
            marked.add(key)
        else:
            batches.setdefault(key, []).append(i)
    finished = []
    for key, ops in batches.items():
        if len(ops) >= 2 and key not in marked and entries[ops[-1]].record_id + 1 not in held:
            finished.extend(ops)
    return finished


def _p2p_op_group(static: StaticRow) -> Optional[str]:
    return static.pg_name if static.name.is_p2p and not static.name.is_coalesced_marker else None


def _marker_group(static: StaticRow) -> Optional[str]:
    return static.pg_name if static.name.is_coalesced_marker else None


def batching_groups(table: EntryTable) -> set[str]:
    """The groups (pg names) in which `table` shows P2P work posted in batches: two ops or
    more under one P2P number, or a marker right after a P2P op of its group and number.
    Read off the columns: a dump of only active entries may hold a long run of batches."""
    ops = table.rows_where(_p2p_op_group)
    if not ops:
        return set()
    numbered = list(zip((group for _, group in ops), table.field_at("p2p_seq_id", [row for row, _ in ops])))
    groups = {group for (group, _), times in Counter(numbered).items() if times > 1}
    markers = table.rows_where(_marker_group)
    if markers:
        op_at = dict(zip((row for row, _ in ops), numbered))
        marker_numbers = table.field_at("p2p_seq_id", [row for row, _ in markers])
        groups.update(group for (row, group), number in zip(markers, marker_numbers)
                      if op_at.get(row - 1) == (group, number))
    return groups


def batch_numbering(table: EntryTable, most: int = 64) -> Optional[bool]:
    """Whether the rank's P2P batches take collective numbers of their own, as a batch
    recorded right after another of its group shows (its first op's record id and P2P
    number one past the other's marker's): torch versions whose `startCoalescing` bumps
    the collective counter number it one past (True); others give both the number of the
    group's last collective (False, whatever else shows). None where no batch follows
    another so among the rank's first `most` markers. The torch build is the job's: one
    rank's answer is every rank's."""
    statics, codes, last = table.statics, table.codes, len(table) - 1
    pairs = [row for row, group in islice(table.rows_where(_marker_group), most)
             if row < last and _p2p_op_group(statics[codes[row + 1]]) == group]
    if not pairs:
        return None
    nexts = [row + 1 for row in pairs]
    records, next_records = table.field_at("record_id", pairs), table.field_at("record_id", nexts)
    p2p, next_p2p = table.field_at("p2p_seq_id", pairs), table.field_at("p2p_seq_id", nexts)
    numbers, next_numbers = table.field_at("collective_seq_id", pairs), table.field_at("collective_seq_id", nexts)
    says = {after - number for record, next_record, p, next_p, number, after
            in zip(records, next_records, p2p, next_p2p, numbers, next_numbers)
            if _ints(record, next_record, p, next_p, number, after) and next_record == record + 1 and next_p == p + 1
            and after - number in (0, 1)}
    return None if not says else says == {1}


def _ints(*values: Value) -> bool:
    return all(type(value) is int for value in values)


def p2p_batch_groups(table: EntryTable) -> set[str]:
    """The groups (pg names) of the rank's batch markers that close P2P ops (the op before
    the marker a P2P op of its group)."""
    statics, codes = table.statics, table.codes
    return {group for row, group in table.rows_where(_marker_group)
            if row and _p2p_op_group(statics[codes[row - 1]]) == group}


def lone_ops_of_finished_batches(table: EntryTable, batching: Container[str],
                                 pg_status: dict[int, PgStatus]) -> list[int]:
    """Rows of the P2P ops of a dump of only active entries that are batches of one op
    that finished, in groups whose ranks post their P2P work in batches (`batching`): an op
    alone under its number, never started, with no marker held, whose next record (its
    marker's) is gone while a later one is held, or, for the dump's newest record, while
    `pg_status` says the batch finished (`_batch_finished_by_status`). torch records a
    batch's ops without events, so they never look finished; the marker, which did
    finish, was left out."""
    ops = [(row, group) for row, group in table.rows_where(_p2p_op_group) if group in batching]
    if not ops:
        return []
    numbered = list(zip((group for _, group in ops), table.field_at("p2p_seq_id", [row for row, _ in ops])))
    times = Counter(numbered)
    markers = table.rows_where(_marker_group)
    marked = set(zip((group for _, group in markers), table.field_at("p2p_seq_id", [row for row, _ in markers])))
    rows = [row for (row, _), key in zip(ops, numbered) if times[key] == 1 and key not in marked]
    held = set(table.field("record_id"))
    newest = max(held)
    facts = zip(rows, *(table.field_at(name, rows) for name in _OWN_EVENTS), table.field_at("record_id", rows))
    return [row for row, state, retired, started, done, record in facts
            if not says_more_than_scheduled(state, retired, started, done) and record + 1 not in held
            and (record + 1 < newest or _batch_finished_by_status(table, row, ops, pg_status))]


def _batch_finished_by_status(table: EntryTable, row: int, ops: list[tuple[int, str]],
                              pg_status: dict[int, PgStatus]) -> bool:
    """Whether pg_status says the batch of the lone op at `row`, the dump's newest record,
    finished: no later record shows that its marker was recorded, but the group's last
    finished work is numbered at or past the batch. Read only where the number can be
    told: pg_status counts in collective numbers (`_counts_collectives`), and the group's
    P2P ops held (of `ops`, (row, group) of the dump's P2P ops) show each batch taking a
    collective number of its own, the two numbers rising together (torch versions that
    bump the collective counter when a batch starts and number its marker so). Elsewhere
    the op's collective number may be an earlier collective's, which finishing says
    nothing of the batch."""
    status = pg_status.get(table.value("pg_id", row))
    if status is None or status.last_completed is None:
        return False
    group = dict(ops)[row]
    rows = [r for r, g in ops if g == group]
    p2p_numbers, collective_numbers = table.field_at("p2p_seq_id", rows), table.field_at("collective_seq_id", rows)
    # The group's collectives would only tell P2P numbers from numbers it cannot tell.
    if _counts_collectives(status, p2p_numbers, []) is not True:
        return False
    own = collective_numbers[rows.index(row)]
    return (isinstance(own, int) and own <= status.last_completed
            and _batches_own_collective_numbers(p2p_numbers, collective_numbers))


def _batches_own_collective_numbers(p2p_numbers: Sequence[Value], collective_numbers: Sequence[Value]) -> bool:
    """Two batches or more held, and every P2P op's collective number is its P2P number
    less one offset: each batch took a collective number of its own."""
    offsets = {p - c for p, c in zip(p2p_numbers, collective_numbers) if isinstance(p, int) and isinstance(c, int)}
    return len(offsets) == 1 and len(set(p2p_numbers)) >= 2


# What an op records of its own (see model.says_more_than_scheduled), in its order.
_OWN_EVENTS = ("state", "retired", "time_started_ns", "time_completed_ns")


# Fast paths beside their plain twins (see frtrace.testing.twins).
PLAIN_TWINS = {"_batch_starts": _batch_starts_plain}
