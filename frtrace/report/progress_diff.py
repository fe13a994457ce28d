"""Did anything move between two dump sets of one job? (`frtrace diff OLD NEW`)

Takes two `LoadedJob`s (dumps read and laid out, not matched) of the same job dumped minutes apart (a hang dumped twice) and
returns a `ProgressDiff`: for every rank and every process group, whether it moved on,
is stuck in the op it was already waiting in, stood idle (nothing pending, nothing new),
or cannot be told; plus a status and a one-line verdict. Raises `JobMismatch` when NEW
does not look like a later dump of OLD's job. Renderers: `diff_report`.

Evidence, always within one rank (record ids are never compared across ranks):
* its entries of the group: the newest record id and sequence numbers (what it had
  enqueued) and the newest finished entry (what it had completed; a group's ops finish
  in the order they were enqueued, so everything before it is finished too);
* the op it was waiting in: the oldest entry of the group after the newest finished one;
* its `pg_status` for the group (keyed by the rank's own pg_id): any change in
  last_enqueued / last_started / last_completed means the rank did something there.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from frtrace.errors import JobMismatch  # raised here, caught by the API's callers
from frtrace.match.analysis import LoadedJob
from frtrace.model import Entry, PgStatus
from frtrace.table.rank_dump import RankDump
from frtrace.table.standing import keeps_only_active
from frtrace.util import fold_ranks
from frtrace.wording import group_label, group_text, ranks_text, seq_text

MOVED, STUCK, IDLE, UNKNOWN = "moved", "stuck", "idle", "unknown"
# Per rank and per group, which outcome wins when a rank's groups disagree.
RANK_ORDER = (STUCK, MOVED, UNKNOWN, IDLE)


@dataclass(frozen=True, slots=True)
class Position:
    """Where one rank stood in one group in one dump set."""

    newest_record_id: Optional[int]
    collective_seq_id: Optional[int]  # newest in its entries of the group
    p2p_seq_id: Optional[int]
    done_record_id: Optional[int]  # its newest finished entry of the group
    waiting: Optional[Entry]  # the oldest entry after that one: the op it waits in
    status: Optional[PgStatus]


@dataclass(frozen=True, slots=True)
class MemberProgress:
    rank: int
    progress: str  # moved | stuck | idle | unknown
    reason: str
    old: Optional[Position]
    new: Optional[Position]

    @property
    def waiting(self) -> Optional[Entry]:
        """The op a stuck rank is still waiting in (as OLD saw it)."""
        return self.old.waiting if self.progress == STUCK and self.old is not None else None


@dataclass(frozen=True, slots=True)
class GroupProgress:
    name: str
    desc: str
    ranks: tuple[int, ...]
    members: tuple[MemberProgress, ...]  # by rank

    @property
    def status(self) -> str:
        present = {m.progress for m in self.members}
        return next((p for p in RANK_ORDER if p in present), UNKNOWN)

    def ranks_with(self, progress: str) -> list[int]:
        return [m.rank for m in self.members if m.progress == progress]


@dataclass(frozen=True, slots=True)
class RankProgress:
    rank: int
    progress: str
    reason: str
    old_record_id: Optional[int]  # the rank's newest record id in OLD / NEW
    new_record_id: Optional[int]
    # Where a stuck rank waits: the group and op it has waited in longest (oldest record).
    stuck_in: Optional[tuple[GroupProgress, Optional[Entry]]] = None


@dataclass(frozen=True, slots=True)
class ProgressDiff:
    status: str  # healthy | faults | inconclusive
    verdict: str
    ranks: tuple[RankProgress, ...]  # by rank
    groups: tuple[GroupProgress, ...]  # by (name, ranks)
    old: LoadedJob
    new: LoadedJob

    def ranks_with(self, progress: str) -> list[int]:
        return [r.rank for r in self.ranks if r.progress == progress]


# --------------------------------------------------------------------------- same job?


def check_same_job(old: LoadedJob, new: LoadedJob) -> None:
    """Raise JobMismatch unless NEW could be a later dump of OLD's run."""
    if old.layout.world_size != new.layout.world_size:
        raise JobMismatch(f"OLD and NEW look like different jobs: world size {old.layout.world_size} in OLD, "
                          f"{new.layout.world_size} in NEW")
    old_sets, new_sets = _configured_rank_sets(old), _configured_rank_sets(new)
    if _names(old) and _names(new) and not set(_names(old)) & set(_names(new)):
        raise JobMismatch("OLD and NEW look like different jobs: no process group in common")
    for name in sorted(set(old_sets) & set(new_sets)):
        if old_sets[name] != new_sets[name]:
            raise JobMismatch(f"OLD and NEW look like different jobs: group {name!r} has ranks "
                              f"{_sets_text(old_sets[name])} in OLD, {_sets_text(new_sets[name])} in NEW")
    new_dumps = {d.rank: d for d in new.dumps}
    backwards = []
    for old_dump in old.dumps:
        new_dump = new_dumps.get(old_dump.rank)
        if new_dump is not None:
            _check_same_records(old_dump, new_dump)
            if _went_backwards(old_dump, new_dump):
                backwards.append(old_dump.rank)
    if backwards:
        if _newest_time(new.dumps) < _newest_time(old.dumps):
            raise JobMismatch("NEW's dumps are older than OLD's: swap the two (frtrace diff NEW OLD)")
        raise JobMismatch(f"{ranks_text(backwards)} went backwards from OLD to NEW (fewer ops enqueued): "
                          "dumps of different runs (was the job restarted between them?)")


def _names(analysis: LoadedJob) -> list[str]:
    return [g.name for g in analysis.layout.groups]


def _configured_rank_sets(analysis: LoadedJob) -> dict[str, set[tuple[int, ...]]]:
    """name -> the rank sets of the groups of that name whose members the dumps listed."""
    sets: defaultdict[str, set[tuple[int, ...]]] = defaultdict(set)
    for group in analysis.layout.groups:
        if group.membership_source == "pg_config":
            sets[group.name].add(group.ranks)
    return sets


def _sets_text(rank_sets: set[tuple[int, ...]]) -> str:
    return " / ".join(fold_ranks(ranks) or "none" for ranks in sorted(rank_sets))


def _identity(entry: Entry) -> tuple[str, int, int, str, int]:
    return entry.pg_name, entry.collective_seq_id, entry.p2p_seq_id, entry.name.profiling_name, entry.time_created_ns


def _same_op(old: Entry, new: Entry) -> bool:
    """Whether two entries of one record id are one op. An op the CUPTI monitor dumped in
    flight has no creation time yet (0): it gets its kernel's start once it finishes."""
    if old.time_created_ns and new.time_created_ns:
        return _identity(old) == _identity(new)
    return _identity(old)[:-1] == _identity(new)[:-1]


def _check_same_records(old: RankDump, new: RankDump) -> None:
    """A record id held in both dumps of one rank is one op, unless the process restarted."""
    if not old.entries or not new.entries:
        return
    low = new.entries[0].record_id
    by_id = {e.record_id: e for e in old.entries if e.record_id >= low}
    for entry in new.entries:
        before = by_id.get(entry.record_id)
        if before is not None and not _same_op(before, entry):
            raise JobMismatch(
                f"rank {old.rank}'s record {entry.record_id} is {_op_text(before)} of group {before.pg_name} in OLD "
                f"but {_op_text(entry)} of group {entry.pg_name} in NEW: dumps of different runs "
                "(was the job restarted between them?)")


def _went_backwards(old: RankDump, new: RankDump) -> bool:
    """NEW holds less than OLD had enqueued: a group's newest sequence number went down
    (a group's ops finish in order, so even dumps of only active ops never drop the newest
    while keeping an older one), or, for whole ring buffers, the newest record id did."""
    if (old.entries and new.entries and not keeps_only_active(old) and not keeps_only_active(new)
            and new.entries[-1].record_id < old.entries[-1].record_id):
        return True
    old_seqs, new_seqs = _newest_seqs(old), _newest_seqs(new)
    return any(new_seqs[key] < seq for key, seq in old_seqs.items() if key in new_seqs)


def _newest_seqs(dump: RankDump) -> dict[tuple[str, bool], int]:
    seqs: dict[tuple[str, bool], int] = {}  # (pg_name, is_p2p) -> newest seq
    for entry in dump.entries:
        key = (entry.pg_name, entry.is_p2p)
        seq = entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id
        if seq > seqs.get(key, -1):
            seqs[key] = seq
    return seqs


def _newest_time(dumps: list[RankDump]) -> int:
    return max((d.entries[-1].time_created_ns for d in dumps if d.entries), default=0)


# --------------------------------------------------------------------------- positions


def _op_text(entry: Entry) -> str:
    """`all_reduce #4`, `send p2p #7`."""
    return f"{entry.op} {seq_text(entry)}"


def waiting_text(entry: Optional[Entry]) -> str:
    return _op_text(entry) if entry is not None else "an op no longer in its buffer"


def _pending_by_status(status: Optional[PgStatus]) -> bool:
    """pg_status says the rank enqueued a collective it has not completed."""
    if status is None or status.last_enqueued is None or status.last_enqueued < 0:
        return False
    return status.last_completed is not None and status.last_enqueued > status.last_completed


class _Side:
    """One dump set, indexed for the comparison: per rank and group only its `Position`
    (a few numbers and the op it waits in), found in one pass over the rank's entries,
    so what is kept does not grow with the entries."""

    def __init__(self, job: LoadedJob) -> None:
        self.dumps = {d.rank: d for d in job.dumps}
        self._groups = {rank: _group_positions(d) for rank, d in self.dumps.items()}
        # pg_status is keyed by the rank's own pg_id: read it off the rank's entries of the
        # group, or with none, take the id its peers use.
        self.pg_ids = {(rank, name): pg_id for rank, groups in self._groups.items() for name, (pg_id, _) in groups.items()}
        self.common_pg_id: dict[str, int] = {}
        self._held: dict[int, set[int]] = {}  # rank -> which of the record ids asked about it holds
        self._completion_info: dict[int, bool] = {}  # rank -> whether its dump marks ops finished
        ids: dict[str, Counter[int]] = defaultdict(Counter)
        for (rank, name), pg_id in self.pg_ids.items():
            ids[name][pg_id] += 1
        for name, counts in ids.items():
            self.common_pg_id[name] = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    def position(self, rank: int, name: str) -> Optional[Position]:
        dump = self.dumps.get(rank)
        if dump is None:
            return None
        pg_id = self.pg_ids.get((rank, name), self.common_pg_id.get(name))
        status = dump.pg_status.get(pg_id) if pg_id is not None else None
        held = self._groups[rank].get(name)
        if held is None:
            return Position(None, None, None, None, None, status)
        return held[1].position(status)

    def newest_record_id(self, rank: int) -> Optional[int]:
        dump = self.dumps.get(rank)
        return dump.entries[-1].record_id if dump is not None and dump.entries else None

    def oldest_record_id(self, rank: int) -> Optional[int]:
        dump = self.dumps.get(rank)
        return dump.entries[0].record_id if dump is not None and dump.entries else None

    def waiting_record_ids(self, rank: int) -> set[int]:
        """The record ids of the ops the rank waits in, one per group at most."""
        return {scan.waiting.record_id for _, scan in self._groups.get(rank, {}).values() if scan.waiting is not None}

    def holds(self, rank: int, record_id: int, asked: set[int]) -> bool:
        """Whether the rank's dump holds `record_id`, one of `asked` (every id that will
        be asked of this rank): the rank's entries are read once for all of them, and
        only those found are kept."""
        held = self._held.get(rank)
        if held is None:
            dump = self.dumps.get(rank)
            held = self._held[rank] = {e.record_id for e in dump.entries if e.record_id in asked} if dump else set()
        return record_id in held

    def has_completion_info(self, rank: int) -> bool:
        known = self._completion_info.get(rank)
        if known is None:
            known = self._completion_info[rank] = _has_completion_info(self.dumps.get(rank))
        return known


class _GroupScan:
    """A rank's entries of one group, folded as they pass (oldest first) into what
    `Position` keeps."""

    __slots__ = ("newest_record_id", "collective_seq_id", "p2p_seq_id", "done_record_id", "waiting")

    def __init__(self) -> None:
        self.newest_record_id: Optional[int] = None
        self.collective_seq_id: Optional[int] = None
        self.p2p_seq_id: Optional[int] = None
        self.done_record_id: Optional[int] = None
        self.waiting: Optional[Entry] = None  # the oldest entry after the newest finished one

    def add(self, entry: Entry) -> None:
        self.newest_record_id = entry.record_id
        if entry.is_p2p:
            self.p2p_seq_id = max(entry.p2p_seq_id, self.p2p_seq_id if self.p2p_seq_id is not None else entry.p2p_seq_id)
        else:
            seq = entry.collective_seq_id
            self.collective_seq_id = max(seq, self.collective_seq_id if self.collective_seq_id is not None else seq)
        if entry.completed:
            self.done_record_id, self.waiting = entry.record_id, None
        elif self.waiting is None:
            self.waiting = entry

    def position(self, status: Optional[PgStatus]) -> Position:
        return Position(self.newest_record_id, self.collective_seq_id, self.p2p_seq_id, self.done_record_id,
                        self.waiting, status)


def _group_positions(dump: RankDump) -> dict[str, tuple[int, _GroupScan]]:
    """pg_name -> (the pg_id of the rank's first entry of the group, its `_GroupScan`)."""
    groups: dict[str, tuple[int, _GroupScan]] = {}
    for entry in dump.entries:
        held = groups.get(entry.pg_name)
        if held is None:
            held = groups[entry.pg_name] = (entry.pg_id, _GroupScan())
        held[1].add(entry)
    return groups


def _has_completion_info(dump: Optional[RankDump]) -> bool:
    if dump is None:
        return False
    if keeps_only_active(dump) or any(s.last_completed is not None and s.last_completed >= 0 for s in dump.pg_status.values()):
        return True
    return any(e.state in ("started", "completed") or e.retired is not None or e.time_completed_ns for e in dump.entries)


# --------------------------------------------------------------------------- comparison


def _member(rank: int, name: str, old: _Side, new: _Side) -> MemberProgress:
    before, after = old.position(rank, name), new.position(rank, name)
    if before is None or after is None:
        where = "OLD" if before is None else "NEW"
        return MemberProgress(rank, UNKNOWN, f"no dump in {where}", before, after)
    status_changed = before.status != after.status and before.status is not None and after.status is not None
    old_newest = old.newest_record_id(rank)
    enqueued = (
        (after.newest_record_id is not None and (old_newest is None or after.newest_record_id > old_newest))
        or _grew(before.collective_seq_id, after.collective_seq_id)
        or _grew(before.p2p_seq_id, after.p2p_seq_id)
        or status_changed
    )
    waiting = before.waiting
    pending = waiting is not None or (before.newest_record_id is None and _pending_by_status(before.status))
    if pending and not (old.has_completion_info(rank) or new.has_completion_info(rank)):
        if enqueued:
            return MemberProgress(rank, MOVED, "enqueued new ops", before, after)
        return MemberProgress(rank, UNKNOWN, "the dumps never mark an op finished", before, after)
    if pending:
        finished = _finished_since(rank, waiting, before, after, old, new)
        if finished:
            return MemberProgress(rank, MOVED, finished, before, after)
        if finished is None:
            return MemberProgress(rank, UNKNOWN, "NEW's dump says nothing of the group", before, after)
        what = _op_text(waiting) if waiting is not None else _next_collective(before.status)
        more = " (and enqueued more behind it)" if enqueued else ""
        return MemberProgress(rank, STUCK, f"still waiting in {what}{more}", before, after)
    if enqueued:
        return MemberProgress(rank, MOVED, "enqueued new ops", before, after)
    return MemberProgress(rank, IDLE, "nothing pending, nothing new", before, after)


def _next_collective(status: Optional[PgStatus]) -> str:
    """The collective pg_status says the rank waits in: the one after its last completed."""
    done = status.last_completed if status is not None and status.last_completed is not None else -1
    return f"collective #{done + 1}"


def _grew(before: Optional[int], after: Optional[int]) -> bool:
    return after is not None and (before is None or after > before)


def _finished_since(rank: int, waiting: Optional[Entry], before: Position, after: Position, old: _Side,
                    new: _Side) -> Optional[str]:
    """Why the op the rank waited in at OLD counts as finished at NEW (a non-empty
    string); "" when it is still pending; None when NEW cannot tell."""
    if before.status is not None and after.status is not None and after.status.last_completed != before.status.last_completed:
        return "completed more (pg_status)"
    if waiting is None:  # only pg_status said something was pending
        return "" if after.status is not None else None
    if after.done_record_id is not None and after.done_record_id >= waiting.record_id:
        return f"finished {_op_text(waiting)}"
    oldest = new.oldest_record_id(rank)
    if oldest is None:
        return "" if after.status is not None else None
    if oldest > waiting.record_id:
        return f"enqueued so much that {_op_text(waiting)} left its ring buffer"
    if not new.holds(rank, waiting.record_id, old.waiting_record_ids(rank)):
        return f"finished {_op_text(waiting)} (no longer among its active ops)"
    return ""


def _rank(rank: int, members: list[tuple[GroupProgress, MemberProgress]], old: _Side, new: _Side) -> RankProgress:
    old_id, new_id = old.newest_record_id(rank), new.newest_record_id(rank)
    if rank not in old.dumps or rank not in new.dumps:
        where = "OLD or NEW" if rank not in old.dumps and rank not in new.dumps else ("OLD" if rank not in old.dumps else "NEW")
        return RankProgress(rank, UNKNOWN, f"no dump in {where}", old_id, new_id)
    stuck = [(group, m) for group, m in members if m.progress == STUCK]
    if stuck:
        # Where it has waited longest: the oldest pending record.
        group, member = min(stuck, key=lambda gm: (gm[1].waiting.record_id if gm[1].waiting else -1, gm[0].name))
        return RankProgress(rank, STUCK, member.reason, old_id, new_id, (group, member.waiting))
    progress = {m.progress for _, m in members}
    if MOVED in progress or _grew(old_id, new_id):
        return RankProgress(rank, MOVED, "moved on", old_id, new_id)
    if UNKNOWN in progress:
        return RankProgress(rank, UNKNOWN, next(m.reason for _, m in members if m.progress == UNKNOWN), old_id, new_id)
    if (not old.dumps[rank].entries and not new.dumps[rank].entries
            and not any(m.old is not None and m.old.status for _, m in members)):
        return RankProgress(rank, UNKNOWN, "no entries in either dump", old_id, new_id)
    return RankProgress(rank, IDLE, "nothing pending, nothing new", old_id, new_id)


def _groups(old: LoadedJob, new: LoadedJob) -> list[tuple[str, str, tuple[int, ...]]]:
    """The groups of both sets, one per (name, ranks): members listed by the dumps win;
    groups rebuilt from entries (gloo's empty pg_config) take the members of both."""
    # (name, the ranks the dumps listed or None) -> (desc, ranks)
    merged: dict[tuple[str, Optional[tuple[int, ...]]], tuple[str, tuple[int, ...]]] = {}
    for analysis in (old, new):
        for group in analysis.layout.groups:
            key = (group.name, group.ranks if group.membership_source == "pg_config" else None)
            known = merged.get(key)
            ranks = tuple(sorted(set(group.ranks) | set(known[1] if known else ())))
            merged[key] = (group.desc or (known[0] if known else ""), ranks)
    return sorted(((name, desc, ranks) for (name, _), (desc, ranks) in merged.items()), key=lambda g: (name_key(g[0]), g[2]))


def diff_progress(old: LoadedJob, new: LoadedJob) -> ProgressDiff:
    """Compare two dump sets of one job; raises JobMismatch when they are not."""
    check_same_job(old, new)
    old_side, new_side = _Side(old), _Side(new)
    groups: list[GroupProgress] = []
    by_rank: defaultdict[int, list[tuple[GroupProgress, MemberProgress]]] = defaultdict(list)
    for name, desc, ranks in _groups(old, new):
        members = tuple(_member(rank, name, old_side, new_side) for rank in ranks)
        group = GroupProgress(name, desc, ranks, members)
        groups.append(group)
        for member in members:
            by_rank[member.rank].append((group, member))
    every = set(old.layout.ranks_found) | set(old.layout.ranks_missing) | set(new.layout.ranks_found) | set(new.layout.ranks_missing)
    rank_progress = tuple(_rank(rank, by_rank.get(rank, []), old_side, new_side) for rank in sorted(every))
    status, verdict = _conclude(rank_progress)
    return ProgressDiff(status, verdict, rank_progress, tuple(groups), old, new)


# --------------------------------------------------------------------------- verdict

# The verdict is one short line: the ranks that stopped first (the likely culprits), the
# op most stuck ranks stayed in, and counts for the rest (the table has every rank).
VERDICT_CLAUSES = 2
# Folded rank lists longer than this are said as a count ("128 ranks").
RANKS_SPELLED_OUT = 24


def _conclude(ranks: tuple[RankProgress, ...]) -> tuple[str, str]:
    by: defaultdict[str, list[RankProgress]] = defaultdict(list)
    for r in ranks:
        by[r.progress].append(r)
    moved = [r.rank for r in by[MOVED]]
    idle = [r.rank for r in by[IDLE]]
    unknown = [r.rank for r in by[UNKNOWN]]
    tail = []
    if unknown:
        tail.append(f"{short_ranks(unknown)} cannot be told ({_reasons(by[UNKNOWN])})")
    if moved:
        tail.append(f"{short_ranks(moved)} moved on")
    if idle and (by[STUCK] or moved):
        # Ranks waiting in no collective while others wait in one, or move on: what holds
        # the job up is most likely theirs, so they come first.
        lead = (f"STUCK: {short_ranks(idle)} made no progress between OLD and NEW, waiting in no collective "
                "(held up outside them?)")
        stuck = [_stuck_clauses(by[STUCK], first_verb="stayed", waiting_on=set(idle))] if by[STUCK] else []
        return "faults", "; ".join([lead] + stuck + tail)
    if by[STUCK]:
        return "faults", f"STUCK: {_stuck_clauses(by[STUCK], first_verb='made no progress')} between OLD and NEW" + \
            "".join(f"; {t}" for t in tail)
    if unknown:
        return "inconclusive", "INCONCLUSIVE: " + "; ".join(tail) + (f"; {short_ranks(idle)} stood idle" if idle else "")
    if not moved:
        return "inconclusive", ("INCONCLUSIVE: no rank moved between OLD and NEW, and none was waiting in a collective: "
                                "the job finished, or every rank is stuck outside collectives (host code, data loading)")
    return "healthy", f"PROGRESSING: every rank ({_all_text(moved)}) moved on between OLD and NEW"


def _stuck_clauses(stuck: list[RankProgress], first_verb: str,
                   waiting_on: Union[frozenset[int], set[int]] = frozenset()) -> str:
    """`ranks 0-3 made no progress in all_reduce #4 of group 0 (default_pg), rank 7 in
    send p2p #2 of group 5 (pp), 12 ranks elsewhere`: one clause per op waited in, over
    the groups of one description (TP groups alike); first those of groups with a rank
    of `waiting_on` (the idle ranks they wait for), then most ranks first."""
    # (desc, op waited in) -> (names of the groups, ranks)
    clauses: dict[tuple[str, str], tuple[set[str], list[int]]] = defaultdict(lambda: (set(), []))
    beside: set[tuple[str, str]] = set()  # clauses of a group that holds one of `waiting_on`
    for r in stuck:
        assert r.stuck_in is not None  # a stuck rank says where it waits
        group, entry = r.stuck_in
        key = (group.desc, waiting_text(entry))
        names, held = clauses[key]
        names.add(group.name)
        held.append(r.rank)
        if waiting_on.intersection(group.ranks):
            beside.add(key)
    ordered = sorted(clauses.items(), key=lambda kv: (kv[0] not in beside, -len(kv[1][1]), min(kv[1][1])))
    parts = [f"{short_ranks(rs)} {first_verb + ' ' if not i else ''}in {what} of {groups_text(names, desc)}"
             for i, ((desc, what), (names, rs)) in enumerate(ordered[:VERDICT_CLAUSES])]
    if len(ordered) > VERDICT_CLAUSES:
        rest = sorted(r for _, (_, rs) in ordered[VERDICT_CLAUSES:] for r in rs)
        parts.append(f"{short_ranks(rest)} elsewhere")
    return ", ".join(parts)


def short_ranks(ranks: list[int]) -> str:
    """`rank 3`, `ranks 0-3,8`, or `128 ranks` when the folded list would be long."""
    text = ranks_text(ranks)
    return text if len(text) <= RANKS_SPELLED_OUT + len("ranks ") else f"{len(set(ranks))} ranks"


def name_key(name: str) -> tuple[int, int, str]:
    """Group names in natural order: 2 before 10, numbers before words."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def groups_text(names: Iterable[str], desc: str) -> str:
    """`group 3 (tp)`, `groups 1-4 (tp)`, `groups a,b (tp)`."""
    ordered = sorted(set(names), key=name_key)
    if len(ordered) == 1:
        return group_text(ordered[0], desc)
    text = fold_ranks(int(n) for n in ordered) if all(n.isdigit() for n in ordered) else ",".join(ordered)
    return "groups " + group_label(text, desc)


def _all_text(ranks: list[int]) -> str:
    return ranks_text(ranks).replace("ranks ", "").replace("rank ", "")


def _reasons(ranks: list[RankProgress]) -> str:
    counts = Counter(r.reason for r in ranks)
    return ", ".join(reason for reason, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
