"""The diagnosis from a job's logs: the same questions as for dumps, asked of the watchdog's lines.

Takes a `LogEvidence` (frtrace.logs); returns a `Diagnosis` whose findings name rules
`logs.*`. Per process group that failed, the *frontier* is the oldest op any member
timed out in (or reported a failure at); the members not seen waiting in it are sorted
by what their logs say:

    logs.mismatch          members waited in the frontier with a different op or other sizes (the odd ones out)
    logs.never_reached     their watchdog said their last enqueued op was older than the frontier,
                           or they entered it only after their peers had given up on it
    logs.went_ahead        most members finished the op before and went no further: the few that
                           entered the frontier issued an op nobody else did (extra_op)
    logs.crashed           they ended with an exception (or a signal) of their own before their peers failed
    logs.silent            they logged, but nothing of the op: they never reached it (or only late);
                           when they outnumber those that waited, the logs cannot tell
    logs.no_log            nothing at all was read for them: the logs cannot place them
    logs.blocked_elsewhere they wait in another group's op (a consequence of that group's finding)
    logs.stuck_behind_peers members waited in the op after others had completed it and failed later on
    logs.all_waited        every member waited in the op: the logs cannot name a rank (network,
                           GPU or NCCL), unless NCCL warnings or a stuck watchdog single some out
    logs.watchdog_stuck    the heartbeat monitor found their watchdog stuck (a hung CUDA or NCCL call)

Membership of a group is what the logs show: every rank for the default group (and for
lines naming no group, as torch before 2.3 wrote); else the ranks that named it, plus
ranks 0..k when a member's rank in the group equals its global rank k (group ranks follow
global order). Time decides what came first: a crash before its peers timed out is the
root; the one that followed is not. Ties and jobs where everyone waited are said to be
undecidable, never guessed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence, Union

from frtrace.diagnosis.finding import Diagnosis, Finding
from frtrace.diagnosis.kinds import kind as kind_row
from frtrace.logs.model import UNNAMED_GROUP, Ending, GroupPosition, LogEvidence, Place, RankLog, TimedOut, WorkAt
from frtrace.match.analysis import Analysis
from frtrace.model import PgStatus
from frtrace.table.rank_dump import RankDump
from frtrace.util import fold_ranks, plural
from frtrace.wording import ranks_text

# torch's OpType names as Flight Recorder spells the ops.
OP_NAMES = {
    "ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "REDUCE": "reduce", "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "_all_gather_base", "ALLGATHER_COALESCED": "allgather_coalesced", "GATHER": "gather",
    "SCATTER": "scatter", "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "_reduce_scatter_base",
    "ALLTOALL_BASE": "all_to_all_single", "ALLTOALL": "all_to_all", "SEND": "send", "RECV": "recv",
    "RECVANYSOURCE": "recv", "BARRIER": "barrier", "COALESCED": "coalesced", "_ALLREDUCE_SPARSE": "_allreduce_sparse",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor_coalesced", "GLOO": "(a gloo op)",
}
# Ops whose sizes every member passes alike; the others legitimately differ per rank.
SAME_SIZE_OPS = frozenset({"ALLREDUCE", "BROADCAST", "REDUCE", "ALLGATHER", "_ALLGATHER_BASE", "REDUCE_SCATTER",
                           "_REDUCE_SCATTER_BASE", "BARRIER", "_ALLREDUCE_SPARSE"})
# Next steps worded for what logs show (the kinds' own point at dump entries and -j).
LOG_NEXT_STEPS = {
    "not_issued": "look at what rank(s) {suspects} were doing instead: the last lines of their log, py-spy dump on the "
                  "live process, or their Flight Recorder dump (TORCH_NCCL_TRACE_BUFFER_SIZE)",
}
# Clocks of different hosts differ; an arrival is late only by more than this (seconds).
CLOCK_SLACK_S = 1.0
DEFAULT_GROUP_NAMES = ("0",)


@dataclass(slots=True)
class LogGroup:
    name: str
    desc: str
    group_id: Optional[int]  # for the reports' headings; None for lines that name no group
    positions: dict[int, GroupPosition]
    members: tuple[int, ...]

    @property
    def label(self) -> str:
        if self.name == UNNAMED_GROUP:
            return "the group the watchdog lines name no further"
        return f"group {self.name}" + (f" ({self.desc})" if self.desc else "")


@dataclass(slots=True)
class Frontier:
    """Where a group's failure is: the oldest op a member failed in, and who waited in it."""

    seq: Optional[int]  # None: the lines carry no sequence number (torch 1.x, gloo)
    op: str
    waiting: tuple[int, ...]
    at: Optional[float]  # the first of its failure lines


@dataclass(slots=True)
class Reading:
    """What the whole job's logs say, as the rules need it."""

    evidence: LogEvidence
    groups: list[LogGroup]
    frontiers: dict[str, Frontier] = field(default_factory=dict)
    waiting_in: dict[int, str] = field(default_factory=dict)  # rank -> group it waits in


def diagnose_logs(evidence: LogEvidence) -> Diagnosis:
    reading = _read(evidence)
    findings: list[Finding] = []
    by_group: dict[str, list[Finding]] = {}
    crashed = crash_findings(reading)
    for group in reading.groups:
        if group.name in reading.frontiers:
            by_group[group.name] = group_findings(reading, group, crashed)
    _link_blocked(reading, by_group)
    for found in by_group.values():
        findings += found
    findings += crashed
    findings += watchdog_stuck(reading, findings)
    findings += unplaced_notes(reading, findings)
    return conclude_logs(reading, findings)


# --------------------------------------------------------------------------- reading

def _read(evidence: LogEvidence) -> Reading:
    positions: dict[str, dict[int, GroupPosition]] = defaultdict(dict)
    for rank, log in evidence.ranks.items():
        for name, position in log.groups.items():
            positions[name][rank] = position
        if log.gloo_timeout_ms is not None and UNNAMED_GROUP not in log.groups:
            positions[UNNAMED_GROUP][rank] = _gloo_position(log)
    job = evidence.job_ranks
    groups = []
    for index, name in enumerate(sorted(positions, key=_group_order)):
        held = positions[name]
        desc = next((p.desc for p in held.values() if p.desc), "")
        group_id = None if name == UNNAMED_GROUP else index + 1
        groups.append(LogGroup(name, desc, group_id, held, _members(name, desc, held, job)))
    reading = Reading(evidence, groups)
    for group in groups:
        frontier = _frontier(group)
        if frontier is not None:
            reading.frontiers[group.name] = frontier
            for rank in frontier.waiting:
                reading.waiting_in.setdefault(rank, group.name)
    return reading


def _group_order(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _gloo_position(log: RankLog) -> GroupPosition:
    timed_out = TimedOut(WorkAt(None, "GLOO", None, None, log.gloo_timeout_ms), None, None, Place(-1, 0))
    return GroupPosition(UNNAMED_GROUP, timed_out=timed_out)


def _members(name: str, desc: str, held: dict[int, GroupPosition], job: tuple[int, ...]) -> tuple[int, ...]:
    if name == UNNAMED_GROUP or desc == "default_pg" or (name in DEFAULT_GROUP_NAMES and not desc):
        return tuple(sorted(set(job) | set(held)))
    known = {p.local_rank: rank for rank, p in held.items() if p.local_rank is not None}
    return tuple(sorted(set(held) | set(inferred_members(known).values())))


def inferred_members(known: dict[int, int]) -> dict[int, int]:
    """Group rank -> global rank for the members the lines do not name but whose global
    rank follows: group ranks go in the order of global ranks, so group rank j between
    known members (a -> ga) and (b -> gb) is ga + (j - a) when that is the only global rank
    left between them (group rank 1 of {0 -> 4, 2 -> 6} is 5; 0..k of {k -> k} are 0..k)."""
    found: dict[int, int] = {}
    if not known:
        return found
    ordered = sorted(known.items())
    top = ordered[-1][0]
    for j in range(top):
        if j in known:
            continue
        lower = max(((a, ga) for a, ga in ordered if a < j), default=(-1, -1))
        upper = min((b, gb) for b, gb in ordered if b > j)
        low, high = lower[1] + (j - lower[0]), upper[1] - (upper[0] - j)
        if low == high:
            found[j] = low
    return found


def unplaced_members(group: "LogGroup") -> list[int]:
    """Group ranks below the highest one seen that no line names and whose global rank
    cannot be told."""
    known = {p.local_rank: rank for rank, p in group.positions.items() if p.local_rank is not None}
    if not known or group.name == UNNAMED_GROUP:
        return []
    inferred = inferred_members(known)
    return [j for j in range(max(known)) if j not in known and j not in inferred]


def _failure_seq(position: GroupPosition) -> Optional[int]:
    if position.failed_at is not None:
        return position.failed_at
    return position.timed_out.work.seq if position.timed_out is not None else None


def _most_common_op(failed: dict[int, GroupPosition], waiting: tuple[int, ...]) -> str:
    """The op most of the waiting members timed out in ("" when none says)."""
    ops = Counter(t.work.op for t in (failed[r].timed_out for r in waiting) if t is not None)
    return ops.most_common(1)[0][0] if ops else ""


def _first_failure_at(failed: dict[int, GroupPosition], waiting: tuple[int, ...]) -> Optional[float]:
    times = [at for at in (failed[r].first_at for r in waiting) if at is not None]
    return min(times) if times else None


def _frontier(group: LogGroup) -> Optional[Frontier]:
    failed = {rank: p for rank, p in group.positions.items() if p.failed}
    if not failed:
        return None
    seqs = [s for s in map(_failure_seq, failed.values()) if s is not None]
    seq = min(seqs) if seqs else None
    waiting = tuple(sorted(rank for rank, p in failed.items() if _failure_seq(p) == seq or seq is None))
    frontier = Frontier(seq, _most_common_op(failed, waiting), waiting, _first_failure_at(failed, waiting))
    _leave_out_late(frontier, failed)
    return frontier


def _leave_out_late(frontier: Frontier, failed: dict[int, GroupPosition]) -> None:
    """A member that entered the op only after the others had given up on it did not
    wait with them (unless none did)."""
    waiting = frontier.waiting
    late = {r for r in waiting if _entered_after_peers_gave_up(failed[r], frontier) is not None}
    if late and len(late) < len(waiting):
        frontier.waiting = tuple(r for r in waiting if r not in late)


# --------------------------------------------------------------------------- per group

def group_findings(reading: Reading, group: LogGroup, crashed: list[Finding]) -> list[Finding]:
    frontier = reading.frontiers[group.name]
    findings = mismatch(reading, group, frontier) + stuck_behind_peers(reading, group, frontier)
    crashed_ranks = {r for f in crashed for r in f.own_suspects}
    absent = _absent(reading, group, frontier)
    # A member waiting in another group's op is a consequence of that group's finding.
    blocked = {r: reading.waiting_in[r] for r in absent if reading.waiting_in.get(r, group.name) != group.name}
    free = [r for r in absent if r not in blocked]
    behind = never_reached(reading, group, frontier, free)
    findings += behind
    findings += _unexplained(reading, group, frontier, free, behind, crashed_ranks & set(absent))
    if blocked:
        findings.append(_blocked(reading, group, frontier, blocked))
    unplaced = [] if group.desc == "default_pg" else unplaced_members(group)
    if unplaced:
        findings.append(_unplaced(reading, group, frontier, unplaced))
    elif not findings and not (crashed_ranks & set(absent)):
        findings.append(all_waited(reading, group, frontier))
    return findings


def _unexplained(reading: Reading, group: LogGroup, frontier: Frontier, free: list[int], behind: list[Finding],
                 crashed_absent: set[int]) -> list[Finding]:
    """Members absent from the frontier and waiting nowhere that neither `behind` (what
    never_reached found) nor a crash of their own explains: silent in their logs (those
    whose log ends in another's failure only when nothing else explains the group), or
    without a log."""
    placed = _placed(behind)
    left = [r for r in free if r not in placed and r not in crashed_absent]
    logs = reading.evidence.ranks
    no_log = [r for r in left if r not in logs]
    own, after_others = _own_and_collateral_ends(reading, [r for r in left if r in logs])
    if own or not (placed or crashed_absent or no_log):
        own = own + after_others
    findings = []
    if own:
        findings.append(_silent(reading, group, frontier, tuple(own)))
    if no_log:
        # Logs of fewer members than waited are a partial paste, not evidence against the rest.
        partial = len(no_log) >= len(frontier.waiting)
        findings.append(_no_log(reading, group, frontier, tuple(no_log), partial))
    return findings


def _placed(behind: list[Finding]) -> set[int]:
    """The ranks never_reached's findings explain: their suspects, and the ranks an
    extra op kept waiting."""
    suspects = {r for f in behind for r in f.own_suspects}
    return suspects | {r for f in behind for r in f.waiting_ranks if f.kind == "extra_op"}


def _own_and_collateral_ends(reading: Reading, quiet: list[int]) -> tuple[list[int], list[int]]:
    """`quiet` (ranks with a log) split: those whose log ends on its own, and those whose
    log ends in another rank's failure."""
    logs = reading.evidence.ranks
    return [r for r in quiet if not _collateral_end(logs[r])], [r for r in quiet if _collateral_end(logs[r])]


def _unplaced(reading: Reading, group: LogGroup, frontier: Frontier, local_ranks: list[int]) -> Finding:
    ranks = ", ".join(map(str, local_ranks))
    statement = (f"{plural(len(local_ranks), 'member')} of {group.label} (group rank {ranks}) never timed out in "
                 f"{_where(group, frontier)} while {ranks_text(frontier.waiting)} did; the logs do not say which global "
                 f"rank {'it is' if len(local_ranks) == 1 else 'they are'}")
    return _finding(reading, "not_issued", "logs.silent", group, frontier, suspects=(), statement=statement,
                    facts={"unplaced_group_ranks": local_ranks}, severity="warning")


def _absent(reading: Reading, group: LogGroup, frontier: Frontier) -> list[int]:
    """Members not seen waiting in the frontier (a rank told to dump that had enqueued it
    was there, only its timer had not run out)."""
    waiting = set(frontier.waiting)
    absent = []
    for rank in group.members:
        if rank in waiting:
            continue
        position = group.positions.get(rank)
        reached = position.reached if position is not None else None
        if frontier.seq is not None and reached is not None and reached >= frontier.seq and not _late(position, frontier):
            continue
        absent.append(rank)
    return absent


def _late(position: Optional[GroupPosition], frontier: Frontier) -> bool:
    return position is not None and _entered_after_peers_gave_up(position, frontier) is not None


def _entered_after_peers_gave_up(position: GroupPosition, frontier: Frontier) -> Optional[float]:
    timed_out = position.timed_out
    if (timed_out is None or timed_out.at is None or timed_out.ran_for_ms is None or frontier.at is None
            or timed_out.work.seq != frontier.seq):
        return None
    entered = timed_out.at - timed_out.ran_for_ms / 1000
    return entered if entered > frontier.at + CLOCK_SLACK_S else None


def _mismatch_statement(group: LogGroup, frontier: Frontier, kind: str, ordered: Sequence[tuple[object, list[int]]],
                        odd: tuple[int, ...], tie: bool) -> str:
    """What `mismatch` says: the classes of members (`ordered`, the largest first), or the
    odd ranks against the majority."""
    if tie:
        shown = " vs ".join(f"{ranks_text(ranks)} {_work_text(group.positions[ranks[0]])}" for _, ranks in ordered)
        return f"tie at {_where(group, frontier)}: no majority — {shown}; the logs cannot tell which side is wrong"
    major = ordered[0][1]
    return (f"{kind.replace('_', ' ')} at {_where(group, frontier)}: {ranks_text(odd)} waited in "
            f"{_work_text(group.positions[odd[0]])} while {ranks_text(major)} waited in "
            f"{_work_text(group.positions[major[0]])}")


def mismatch(reading: Reading, group: LogGroup, frontier: Frontier) -> list[Finding]:
    """Members waited in the frontier with different ops, or other sizes of one op."""
    timed = {r: group.positions[r].timed_out for r in frontier.waiting if group.positions[r].timed_out is not None}
    if len(timed) < 2 or frontier.seq is None:
        return []
    classes: dict[tuple[str, tuple[Optional[Union[int, str]], ...]], list[int]] = defaultdict(list)
    for rank, timed_out in sorted(timed.items()):
        work = timed_out.work  # type: ignore[union-attr]
        sizes = (work.numel_in, work.numel_out, work.tensor_shape) if work.op in SAME_SIZE_OPS else ()
        classes[(work.op, sizes)].append(rank)
    if len(classes) < 2:
        return []
    ordered = sorted(classes.items(), key=lambda item: (-len(item[1]), item[1][0]))
    (_, major), odd_classes = ordered[0], ordered[1:]
    tie = len(major) == len(odd_classes[0][1])
    odd = tuple(sorted(r for _, ranks in odd_classes for r in ranks))
    ops = {key[0] for key in classes}
    kind = "op_mismatch" if len(ops) > 1 else "size_mismatch"
    statement = _mismatch_statement(group, frontier, kind, ordered, odd, tie)
    facts = {"classes": [{"ranks": list(ranks), "entry": _work_text(group.positions[ranks[0]])} for _, ranks in ordered],
             "tie": tie}
    return [_finding(reading, kind, "logs.mismatch", group, frontier, suspects=() if tie else odd,
                     ranks=tuple(sorted(timed)), statement=statement, facts=facts,
                     severity="warning" if tie else None, waiting=tuple(major))]


def stuck_behind_peers(reading: Reading, group: LogGroup, frontier: Frontier) -> list[Finding]:
    """Members still waited in the frontier while others of the group had completed it and
    failed further on: the op never finished on the first (as the dumps' stuck_on_device).
    Only in a group the lines name: with `[Rank N]` alone two groups' numbers would mix."""
    if frontier.seq is None or group.name == UNNAMED_GROUP:
        return []
    seq = frontier.seq
    past = tuple(sorted(r for r, p in group.positions.items()
                        if r not in frontier.waiting and p.failed and ((_failure_seq(p) or -1) > seq
                                                                      or (p.last_completed is not None and p.last_completed >= seq))))
    if not past:
        return []
    statement = (f"{ranks_text(frontier.waiting)} still waited in {_where(group, frontier)} after {ranks_text(past)} had "
                 f"completed it and gone on (to fail later): it never finished on {'it' if len(frontier.waiting) == 1 else 'them'}")
    return [_finding(reading, "stuck", "logs.stuck_behind_peers", group, frontier, suspects=frontier.waiting,
                     statement=statement, facts={"went_past": list(past)})]


def never_reached(reading: Reading, group: LogGroup, frontier: Frontier, absent: list[int]) -> list[Finding]:
    """Absent members whose own lines place them: behind the frontier, or in it only after
    their peers had given up on it."""
    behind, late = _behind_and_late(group, frontier, absent)
    findings = []
    waiting = frontier.waiting
    idle = {r for r, reached in behind.items() if reached == (frontier.seq or 0) - 1}
    if behind and len(idle) == len(behind) > len(waiting) and not late:
        findings.append(_went_ahead(reading, group, frontier, behind))
    elif behind:
        findings.append(_behind(reading, group, frontier, behind))
    if late:
        ranks = tuple(sorted(late))
        statement = (f"{ranks_text(ranks)} entered {_where(group, frontier)} only after "
                     f"{ranks_text(frontier.waiting)} had given up on it (timed out): they were behind by more than the timeout")
        findings.append(_finding(reading, "not_issued", "logs.never_reached", group, frontier, suspects=ranks,
                                 statement=statement, facts={"entered_late": True}))
    return findings


def _behind_and_late(group: LogGroup, frontier: Frontier, absent: list[int]) -> tuple[dict[int, int], dict[int, float]]:
    """({rank: its last enqueued op} for absent members behind the frontier, {rank: when
    it entered} for those that entered it only after their peers had given up)."""
    behind: dict[int, int] = {}
    late: dict[int, float] = {}
    for rank in absent:
        position = group.positions.get(rank)
        if position is None:
            continue
        entered = _entered_after_peers_gave_up(position, frontier)
        if entered is not None:
            late[rank] = entered
        elif frontier.seq is not None and position.reached is not None and position.reached < frontier.seq:
            behind[rank] = position.reached
    return behind, late


def _went_ahead(reading: Reading, group: LogGroup, frontier: Frontier, behind: dict[int, int]) -> Finding:
    """Most members finished the op before and went no further; the few that entered
    an op nobody else did went ahead (consensus, as for dumps: extra_op)."""
    waiting = frontier.waiting
    statement = (f"{ranks_text(waiting)} issued {_where(group, frontier)}, which {ranks_text(sorted(behind))} never "
                 f"issued: their last enqueued op was #{(frontier.seq or 0) - 1}, and they wait in nothing else")
    return _finding(reading, "extra_op", "logs.went_ahead", group, frontier, suspects=waiting,
                    statement=statement, facts={"last_enqueued": {str(r): behind[r] for r in sorted(behind)}},
                    waiting=tuple(sorted(behind)))


def _behind(reading: Reading, group: LogGroup, frontier: Frontier, behind: dict[int, int]) -> Finding:
    """Members behind the frontier: they never reached it (an even split blames them too)."""
    waiting = frontier.waiting
    ranks = tuple(sorted(behind))
    said = _fold_values(behind)
    statement = (f"{ranks_text(ranks)} never reached {_where(group, frontier)}: {said} "
                 f"while {ranks_text(waiting)} timed out in it")
    facts: dict[str, Any] = {"last_enqueued": {str(r): behind[r] for r in ranks}}
    if len(ranks) == len(waiting):
        facts["tie"] = True
        statement += " (an even split: the ranks that did not arrive are blamed, as they are behind)"
    return _finding(reading, "not_issued", "logs.never_reached", group, frontier, suspects=ranks,
                    statement=statement, facts=facts)


def _fold_values(values: dict[int, int]) -> str:
    by_value: dict[int, list[int]] = defaultdict(list)
    for rank, value in sorted(values.items()):
        by_value[value].append(rank)
    parts = [f"{'its' if len(ranks) == 1 else 'their'} last enqueued op was #{value}" + (f" ({ranks_text(ranks)})" if len(by_value) > 1 else "")
             for value, ranks in sorted(by_value.items())]
    return "; ".join(parts)


def _collateral_end(log: RankLog) -> bool:
    return log.ending is not None and log.ending.collateral


def _silent(reading: Reading, group: LogGroup, frontier: Frontier, ranks: tuple[int, ...]) -> Finding:
    logs = reading.evidence.ranks
    if len(ranks) > len(frontier.waiting):
        # More members said nothing than waited: the few that waited may as well have gone
        # ahead of idle peers. Without positions the logs cannot tell which.
        statement = (f"{ranks_text(ranks)} logged nothing of {_where(group, frontier)}, which only "
                     f"{ranks_text(frontier.waiting)} timed out in: the logs cannot tell whether the many never reached "
                     "it or the few went ahead")
        return _finding(reading, "not_issued", "logs.silent", group, frontier, suspects=(), statement=statement,
                        facts={"silent": True, "outnumbered": True}, severity="warning")
    ended = [r for r in ranks if logs[r].ending is not None]
    statement = (f"{ranks_text(ranks)} logged nothing of {_where(group, frontier)} while {ranks_text(frontier.waiting)} "
                 f"timed out in it: {'it' if len(ranks) == 1 else 'they'} never reached it (or reached it too late to time out "
                 "before the job was torn down)")
    early = _ended_early(reading, ranks, frontier)
    if early:
        statement += f"; {ranks_text(early)} logged nothing after {_clock(min(_known(logs[r].last_at) for r in early))}"
    if ended:
        statement += "; " + "; ".join(f"{ranks_text([r])} ended with {logs[r].ending.what}" for r in ended[:3])  # type: ignore[union-attr]
    facts: dict[str, Any] = {"silent": True}
    if early:
        facts["log_ends_early"] = list(early)
    return _finding(reading, "not_issued", "logs.silent", group, frontier, suspects=ranks, statement=statement, facts=facts)


def _ended_early(reading: Reading, ranks: tuple[int, ...], frontier: Frontier) -> list[int]:
    if frontier.at is None:
        return []
    logs = reading.evidence.ranks
    cutoff = frontier.at - CLOCK_SLACK_S
    return [r for r in ranks if logs[r].last_at is not None and _known(logs[r].last_at) < cutoff]


def _no_log(reading: Reading, group: LogGroup, frontier: Frontier, ranks: tuple[int, ...], partial: bool) -> Finding:
    they = "it" if len(ranks) == 1 else "they"
    statement = (f"no log line of {ranks_text(ranks)} was read, while {ranks_text(frontier.waiting)} timed out in "
                 f"{_where(group, frontier)}: the logs cannot say where {they} stood")
    if partial:
        statement += (f"; the logs cover only {plural(len(frontier.waiting), 'waiting member')} of {len(group.members)}, "
                      "too few to blame the rest")
        return _finding(reading, "missing_log", "logs.no_log", group, frontier, suspects=(), statement=statement,
                        facts={"no_log": list(ranks), "partial": True}, severity="warning")
    statement += f", and {they} {'is' if len(ranks) == 1 else 'are'} the only members not seen waiting"
    return _finding(reading, "missing_log", "logs.no_log", group, frontier, suspects=ranks, statement=statement,
                    facts={"no_log": list(ranks)})


def _blocked(reading: Reading, group: LogGroup, frontier: Frontier, blocked: dict[int, str]) -> Finding:
    ranks = tuple(sorted(blocked))
    elsewhere = sorted(set(blocked.values()))
    statement = (f"{ranks_text(ranks)} never reached {_where(group, frontier)}: they wait in "
                 + ", ".join(_label_of(reading, name) for name in elsewhere))
    finding = _finding(reading, "not_issued", "logs.blocked_elsewhere", group, frontier, suspects=ranks,
                       statement=statement, facts={"waiting_in": {str(r): blocked[r] for r in ranks}})
    finding.absent_ranks = ranks
    return finding


def all_waited(reading: Reading, group: LogGroup, frontier: Frontier) -> Finding:
    """Every member waited in the op: nothing in the logs singles a rank out, unless some
    logged NCCL warnings."""
    logs = reading.evidence.ranks
    warned = tuple(r for r in frontier.waiting if logs.get(r) and logs[r].nccl_warning_count)
    op = OP_NAMES.get(frontier.op, frontier.op.lower()) or "the op"
    seq = f" #{frontier.seq}" if frontier.seq is not None else ""
    members = "ranks" if group.name == UNNAMED_GROUP else f"members of {group.label}"
    if len(frontier.waiting) == 1:
        statement = f"{ranks_text(frontier.waiting)}, the only member the logs show, waited in {op}{seq} and it never completed"
    else:
        statement = f"all {len(frontier.waiting)} {members} waited in {op}{seq} and none completed it"
    facts: dict[str, Any] = {"waiting": fold_ranks(frontier.waiting)}
    if warned and len(warned) < len(frontier.waiting):
        statement += f"; only {ranks_text(warned)} logged NCCL warnings: " + logs[warned[0]].nccl_warnings[0]
        facts["nccl_warnings"] = {str(r): logs[r].nccl_warnings for r in warned}
        return _finding(reading, "stuck", "logs.all_waited", group, frontier, suspects=warned, statement=statement,
                        facts=facts)
    statement += ": the logs cannot name a rank (a network, GPU or NCCL fault, or a rank outside the logs)"
    return _finding(reading, "stuck", "logs.all_waited", group, frontier, suspects=(), statement=statement, facts=facts,
                    severity="warning")


# --------------------------------------------------------------------------- job-wide

def crash_findings(reading: Reading) -> list[Finding]:
    """Ranks that ended with an exception (or signal) of their own before their peers'
    watchdogs fired: where the trouble began."""
    crashed = _own_crashes(reading)
    if not crashed:
        return []
    findings = []
    by_what: dict[tuple[str, str], list[int]] = defaultdict(list)
    for rank, own in crashed.items():
        by_what[(own.what, own.message)].append(rank)
    for (what, message), ranks in by_what.items():
        first = min((at for r in ranks if (at := crashed[r].at) is not None), default=None)
        statement = _crash_statement(reading, ranks, what, message, first)
        facts = {"ending": what, "message": message}
        findings.append(_job_finding(reading, "crashed", "logs.crashed", tuple(ranks), statement, facts, first))
    return findings


def _own_crashes(reading: Reading) -> dict[int, Ending]:
    """rank -> its first error of its own, for the ranks whose error did not follow from
    a timeout of their own or come after their peers had failed while they waited."""
    first_failure = _first_peer_failure(reading)
    crashed: dict[int, Ending] = {}
    for rank, log in sorted(reading.evidence.ranks.items()):
        own = log.first_own_error
        if own is None:
            continue
        if _failed_before(log, own):
            continue  # it timed out first: its exception followed from that
        if own.at is not None and first_failure is not None and own.at > first_failure + CLOCK_SLACK_S and rank in reading.waiting_in:
            continue
        crashed[rank] = own
    return crashed


def _crash_statement(reading: Reading, ranks: list[int], what: str, message: str, first: Optional[float]) -> str:
    statement = f"{ranks_text(ranks)} ended with {what}" + (f": {_first_sentence(message)}" if message else "")
    if first is not None:
        statement += f" at {_clock(first)}"
    waiting = tuple(sorted(reading.waiting_in))
    if waiting:
        statement += f", before {ranks_text(waiting)} timed out waiting"
    return statement


def _first_peer_failure(reading: Reading) -> Optional[float]:
    times = [f.at for f in reading.frontiers.values() if f.at is not None]
    return min(times) if times else None


def _failed_before(log: RankLog, own: Ending) -> bool:
    for position in log.groups.values():
        if not position.failed or position.told:
            continue
        if own.at is not None and position.first_at is not None:
            if position.first_at < own.at - CLOCK_SLACK_S:
                return True
        elif own.place is not None and position.first_place is not None and own.place.file == position.first_place.file:
            if position.first_place.line < own.place.line:
                return True
    return False


def _stuck_statement(stuck: tuple[int, ...], seconds: int, everyone: bool) -> str:
    statement = (f"the heartbeat monitor found the watchdog of {ranks_text(stuck)} stuck"
                 + (f" for {seconds} s" if seconds else "") + ": a CUDA or NCCL call hung there (or a thread held the GIL)")
    if everyone:
        statement += "; on every rank alike, so the logs cannot name one (a job-wide stall: storage, host, driver)"
    return statement


def watchdog_stuck(reading: Reading, findings: list[Finding]) -> list[Finding]:
    """The heartbeat monitor found the watchdog stuck on some ranks (not all): a CUDA or
    NCCL call hung there, or another thread held the GIL."""
    logs = reading.evidence.ranks
    stuck = tuple(sorted(r for r, log in logs.items() if log.heartbeat_stuck_s is not None))
    if not stuck:
        return []
    everyone = len(stuck) == len(logs)
    seconds = max(logs[r].heartbeat_stuck_s or 0 for r in stuck)
    statement = _stuck_statement(stuck, seconds, everyone)
    decided = any(f.own_suspects and f.own_severity == "error" for f in findings)
    suspects = () if everyone or decided else stuck
    return [_job_finding(reading, "stuck", "logs.watchdog_stuck", stuck, statement, {"stuck_s": seconds},
                         min((at for at in (logs[r].heartbeat_at for r in stuck) if at is not None), default=None),
                         suspects=suspects, severity="error" if suspects else "warning")]


def unplaced_notes(reading: Reading, findings: list[Finding]) -> list[Finding]:
    """What the logs could not use: ranks of the job no line was read for (when no
    finding already names them), and the reader's notes."""
    named = {r for f in findings for r in f.ranks}
    silent = tuple(r for r in reading.evidence.silent_ranks if r not in named)
    notes = []
    if silent and reading.frontiers:
        notes.append(_job_finding(reading, "missing_log", "logs.no_log", silent,
                                  f"no log line of {ranks_text(silent)} was read: the logs cannot say where "
                                  f"{'it' if len(silent) == 1 else 'they'} stood", {"no_log": list(silent)}, None,
                                  suspects=(), severity="info"))
    return notes


# --------------------------------------------------------------------------- linking and verdict

def _link_blocked(reading: Reading, by_group: dict[str, list[Finding]]) -> None:
    """A finding about ranks that wait in another group's op follows from that group's
    finding: it is a consequence, and blames nobody."""
    roots = {name: next((f for f in found if f.rule != "logs.blocked_elsewhere"), None) for name, found in by_group.items()}
    for found in by_group.values():
        for finding in found:
            if finding.rule != "logs.blocked_elsewhere":
                continue
            elsewhere = set(finding.facts["waiting_in"].values())
            root = next((roots[name] for name in sorted(elsewhere) if roots.get(name) is not None), None)
            if root is not None:
                finding.caused_by, finding.link = root, "blocked"


_SEVERITY = {"error": 0, "warning": 1, "info": 2}


def _decides_fault(finding: Finding) -> bool:
    """A root error with suspects, of a kind that makes the status `faults`."""
    return (finding.is_root and bool(finding.suspect_ranks) and finding.severity == "error"
            and kind_row(finding.kind).decides_fault)


def conclude_logs(reading: Reading, findings: list[Finding]) -> Diagnosis:
    ordered = sorted(findings, key=lambda f: (not f.is_root, _SEVERITY[f.severity], f.age_ns,
                                              f.group_id if f.group_id is not None else -1, f.kind))
    roots = [f for f in ordered if _decides_fault(f)]
    suspects = tuple(sorted({r for f in roots for r in f.suspect_ranks}))
    if roots:
        more = f" (+{plural(len(roots) - 1, 'more root finding')})" if len(roots) > 1 else ""
        return Diagnosis("faults", suspects, f"FAULT: {_with_hosts(roots[0].message, roots[0])}{more}", ordered)
    if any(f.severity in ("error", "warning") for f in ordered) or reading.frontiers:
        notes = [f.message for f in ordered if f.severity in ("warning", "info", "error")]
        return Diagnosis("inconclusive", (), "INCONCLUSIVE: " + (notes[0] if notes else "the logs cannot decide"), ordered)
    ranks = len(reading.evidence.ranks)
    return Diagnosis("healthy", (), f"HEALTHY: no watchdog timeout, error or crash in the logs of {plural(ranks, 'rank')}",
                     ordered)


def _with_hosts(message: str, finding: Finding) -> str:
    hosts = finding.facts.get("suspect_hosts")
    if not hosts:
        return message
    return message + " [" + "; ".join(f"rank {r} on {h}" for r, h in list(hosts.items())[:4]) + \
        (", ..." if len(hosts) > 4 else "") + "]"


# --------------------------------------------------------------------------- findings

def _finding(reading: Reading, kind: str, rule: str, group: LogGroup, frontier: Frontier, *, suspects: tuple[int, ...],
             statement: str, facts: dict[str, Any], ranks: Optional[tuple[int, ...]] = None,
             severity: Optional[str] = None, waiting: Optional[tuple[int, ...]] = None) -> Finding:
    facts = dict(facts)
    if kind in LOG_NEXT_STEPS:
        facts["next_step"] = LOG_NEXT_STEPS[kind]
    facts["frontier"] = {"seq": frontier.seq, "op": OP_NAMES.get(frontier.op, frontier.op.lower()),
                         "waiting": fold_ranks(frontier.waiting)}
    _add_hosts(reading, facts, suspects)
    return Finding(kind=kind, rule=rule, own_severity=severity or kind_row(kind).severity, group_id=group.group_id,
                   pg_name=group.name, pg_desc=group.desc, op=OP_NAMES.get(frontier.op, frontier.op.lower()) or None,
                   collective_seq_id=frontier.seq, p2p_seq_id=None,
                   ranks=ranks or tuple(sorted(set(suspects) | set(frontier.waiting))), own_suspects=suspects,
                   statement=statement, facts=facts, waiting_ranks=waiting or frontier.waiting, absent_ranks=suspects,
                   age_ns=_age(frontier.at))


def _job_finding(reading: Reading, kind: str, rule: str, ranks: tuple[int, ...], statement: str, facts: dict[str, Any],
                 at: Optional[float], suspects: Optional[tuple[int, ...]] = None, severity: Optional[str] = None) -> Finding:
    facts = dict(facts)
    chosen = ranks if suspects is None else suspects
    _add_hosts(reading, facts, chosen)
    return Finding(kind=kind, rule=rule, own_severity=severity or kind_row(kind).severity, group_id=None, pg_name="",
                   pg_desc="", op=None, collective_seq_id=None, p2p_seq_id=None, ranks=ranks, own_suspects=chosen,
                   statement=statement, facts=facts, age_ns=_age(at))


def _add_hosts(reading: Reading, facts: dict[str, Any], ranks: tuple[int, ...]) -> None:
    hosts = {str(r): reading.evidence.host_of(r) for r in ranks if reading.evidence.host_of(r)}
    if hosts:
        facts["suspect_hosts"] = hosts


def _age(at: Optional[float]) -> int:
    # Findings without a time sort after those with one.
    return int(at * 1e9) if at is not None else 1 << 62


def _where(group: LogGroup, frontier: Frontier) -> str:
    op = OP_NAMES.get(frontier.op, frontier.op.lower()) or "the op"
    seq = f" #{frontier.seq}" if frontier.seq is not None else ""
    return f"{op}{seq}" + ("" if group.name == UNNAMED_GROUP else f" of {group.label}")


def _label_of(reading: Reading, name: str) -> str:
    group = next(g for g in reading.groups if g.name == name)
    frontier = reading.frontiers[name]
    return _where(group, frontier)


def _work_text(position: GroupPosition) -> str:
    if position.timed_out is None:
        return "?"
    work = position.timed_out.work
    op = OP_NAMES.get(work.op, work.op.lower())
    if work.numel_in is not None:
        return f"{op} (numel in {work.numel_in}, out {work.numel_out})"
    if work.tensor_shape:
        return f"{op} {work.tensor_shape}"
    return op


def _first_sentence(text: str, limit: int = 120) -> str:
    cut = text.find(". ")
    text = text[: cut + 1] if 0 < cut < limit else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _known(at: Optional[float]) -> float:
    return at if at is not None else 0.0


def _clock(at: float) -> str:
    seconds_of_day = at % 86400
    hh, rest = divmod(int(seconds_of_day), 3600)
    mm, ss = divmod(rest, 60)
    return f"{hh:02d}:{mm:02d}:{ss:02d}"


# --------------------------------------------------------------------------- logs with dumps

def with_dumps(analysis: Analysis, dumps_diagnosis: Diagnosis, evidence: LogEvidence) -> Diagnosis:
    """The dumps' diagnosis with what the logs add: positions from logs stand in for ranks
    whose dump is missing (their findings join the dumps'), hosts join the suspects, and
    where a rank's dump and log disagree a warning says so."""
    layout = analysis.layout
    dumped = set(layout.ranks_found)
    logs_diagnosis = diagnose_logs(evidence)
    stand_ins = _stand_ins(analysis, logs_diagnosis, dumped)
    conflicts = _conflicts(analysis, evidence, logs_diagnosis, dumped, set(dumps_diagnosis.suspect_ranks))
    findings = list(dumps_diagnosis.findings)
    for finding in findings:
        if finding.is_root and finding.own_suspects:
            _add_hosts_of(evidence, finding)
    status, suspects, verdict = _conclusion_with_logs(dumps_diagnosis, logs_diagnosis, stand_ins)
    return Diagnosis(status, suspects, verdict, stand_ins + findings + conflicts)


def _conclusion_with_logs(dumps_diagnosis: Diagnosis, logs_diagnosis: Diagnosis,
                          stand_ins: list[Finding]) -> tuple[str, tuple[int, ...], str]:
    """(status, suspects, verdict line) of the dumps' diagnosis with the logs' stand-ins
    for ranks without a dump, and the logs' own status where the dumps see nothing."""
    status, suspects, verdict = dumps_diagnosis.status, dumps_diagnosis.suspect_ranks, dumps_diagnosis.verdict
    new_roots = [f for f in stand_ins if f.is_root and f.suspect_ranks and f.severity == "error"]
    told = [f for f in new_roots if set(f.own_suspects) <= set(suspects)]
    if status == "faults" and told:  # the dumps blame a rank without a dump; its log says what became of it
        verdict += f"; its log: {told[0].statement.split(': ', 1)[-1]}"
    if new_roots:
        suspects = tuple(sorted(set(suspects) | {r for f in new_roots for r in f.suspect_ranks}))
        if status != "faults":
            status, verdict = "faults", f"FAULT: {_with_hosts(new_roots[0].message, new_roots[0])}"
    if status == "healthy" and (logs_diagnosis.status != "healthy"):
        status = "inconclusive"
        verdict = ("INCONCLUSIVE: the dumps show nothing wrong, but the logs do: "
                   + logs_diagnosis.verdict.split(": ", 1)[-1])
    return status, suspects, verdict


def _stand_ins(analysis: Analysis, logs_diagnosis: Diagnosis, dumped: set[int]) -> list[Finding]:
    """The logs' findings about ranks without a dump, in the dumps' groups."""
    found = []
    for finding in logs_diagnosis.findings:
        undumped = tuple(r for r in finding.own_suspects if r not in dumped)
        if not undumped or finding.kind == "missing_log":
            continue
        copy = replace(finding, own_suspects=undumped, group_id=_dump_group(analysis, finding),
                       statement=f"from the logs (no dump of {ranks_text(undumped)}): {finding.statement}",
                       caused_by=None, link=None)
        copy.facts = dict(finding.facts, stands_in_for_dump=list(undumped))
        found.append(copy)
    return found


def _dump_group(analysis: Analysis, finding: Finding) -> Optional[int]:
    if finding.group_id is None:
        return None
    ids = analysis.layout.ids_by_name.get(finding.pg_name)
    return ids[0] if ids else 10_000_000 + finding.group_id  # a group the dumps do not hold


def _conflicts(analysis: Analysis, evidence: LogEvidence, logs_diagnosis: Diagnosis, dumped: set[int],
               dump_suspects: set[int]) -> list[Finding]:
    """Where a rank's dump and its log disagree on where it stood."""
    disagreements: dict[str, list[int]] = defaultdict(list)
    for dump in analysis.dumps:
        log = evidence.ranks.get(dump.rank)
        if log is None:
            continue
        for position in log.groups.values():
            for what in _position_conflicts(dump, position):
                disagreements[what].append(dump.rank)
    named = {r for f in logs_diagnosis.findings if f.is_root and f.severity == "error" for r in f.own_suspects}
    for rank in sorted((named & dumped) - dump_suspects):
        disagreements["the logs name it, its dump does not place it there"].append(rank)
    findings = []
    for what, ranks in disagreements.items():
        findings.append(Finding(kind="evidence_conflict", rule="logs.disagrees_with_dump", own_severity="warning",
                                group_id=None, pg_name="", pg_desc="", op=None, collective_seq_id=None, p2p_seq_id=None,
                                ranks=tuple(ranks), own_suspects=(),
                                statement=f"dump and log of {ranks_text(ranks)} disagree: {what}",
                                facts={"ranks": list(ranks)}))
    return findings


def _position_conflicts(dump: RankDump, position: GroupPosition) -> list[str]:
    """Where the rank's dump and its log disagree on where it stood in one group."""
    status = _dump_status(dump, position)
    if status is None:
        return []
    said = []
    seq = _failure_seq(position)
    if seq is not None and status.last_completed is not None and status.last_completed >= seq:
        said.append(f"the dump says #{seq} of group {position.name} completed; the log says it failed in it")
    if (position.last_enqueued is not None and status.last_enqueued is not None
            and position.last_enqueued > status.last_enqueued):
        said.append(f"the log has enqueued more of group {position.name} than the dump "
                    f"(#{position.last_enqueued} vs #{status.last_enqueued})")
    return said


def _dump_status(dump: RankDump, position: GroupPosition) -> Optional[PgStatus]:
    # Dumps key pg_status by local id, as an int or as its string, or by position in pg_config.
    statuses: Mapping[Any, PgStatus] = dump.pg_status
    if position.local_id is not None and position.local_id in statuses:
        return statuses[position.local_id]
    if position.local_id is not None and str(position.local_id) in statuses:
        return statuses[str(position.local_id)]
    names = [c.name for c in dump.pg_config]
    if position.name in names:
        index = names.index(position.name)
        for key in (index, str(index)):
            if key in statuses:
                return statuses[key]
    return None


def _add_hosts_of(evidence: LogEvidence, finding: Finding) -> None:
    hosts = {str(r): evidence.host_of(r) for r in finding.own_suspects if evidence.host_of(r)}
    if hosts:
        finding.facts = dict(finding.facts, suspect_hosts=hosts)
