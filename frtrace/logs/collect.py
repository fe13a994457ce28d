"""Fold the events of a job's log lines into where each rank stood: `read_logs`.

Takes log paths (files or directories, see `inputs.discover_logs`); returns a
`LogEvidence`. Every line is first put in a *cell*: the file and prefixes it came with
(its *source*: `[rankN]:`, `[defaultN]:`, `srun -l`'s `N:`, Ray's pid) and the rank its
message names (`[Rank N]`, `[PG ... Rank N]`). Once the file is read, each source is
resolved to the global rank it speaks for: torchrun's `[rankN]:` label; else the rank
its default-group lines or init options claim; else the rank in the file's name; else
a local label (single-node jobs); else the one rank its messages name. A source whose
lines claim several ranks (a combined log without prefixes, a node's `srun -l` task
running eight processes) is split by the rank each message names.

Two runs in one file (the launcher restarted the workers) are told apart: a run starts
again when a launcher restart line, an NCCL version banner or a default group's init
options follow a failure. Only each file's last run is read; the others are counted.
Memory stays bounded: a cell keeps positions per group and a few lines, not the lines.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import frtrace.logs.grammar as g
from frtrace.logs.inputs import LogInputError, LogSource, discover_logs
from frtrace.logs.model import (
    UNNAMED_GROUP,
    Ending,
    GroupPosition,
    LogEvidence,
    LogFile,
    Place,
    RankLog,
    TimedOut,
    Told,
    WorkAt,
)
from frtrace.logs.stream import BLOCK, StreamStats, read_marked_lines

# NCCL WARN lines kept per rank (the rest are counted).
KEPT_WARNINGS = 3
# A sequence number beyond this is a counter torch printed before setting it (2.3 wrote
# `last completed NCCL work: 3452013982` for a group that had done one op).
IMPLAUSIBLE_SEQ = 1 << 40
_PEER = re.compile(r"(?:remote )?peer ([\w.-]+)[<\[]")
# Whose lines a source holds: (pdsh host tag, srun task, label kind, label rank, Ray pid).
SourceKey = tuple[Optional[str], Optional[int], Optional[str], Optional[int], Optional[int]]
# One file as read: the log, what reading it met, how many runs it held.
FileRead = tuple[LogSource, StreamStats, int]


@dataclass(slots=True)
class Cell:
    """What one process said, as far as one source and one message rank tell."""

    groups: dict[str, GroupPosition] = field(default_factory=dict)
    pending: list[TimedOut] = field(default_factory=list)  # timeouts whose group a later line names
    in_traceback: bool = False
    ending: Optional[Ending] = None
    first_own_error: Optional[Ending] = None
    heartbeat_stuck_s: Optional[int] = None
    heartbeat_at: Optional[float] = None
    gloo_timeout_ms: Optional[int] = None
    lines: int = 0
    last_at: Optional[float] = None
    warnings: list[str] = field(default_factory=list)
    warning_count: int = 0
    peers_gone: list[str] = field(default_factory=list)
    wordings: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Source:
    file: int
    path_rank: Optional[int]
    label: Optional[str]
    label_rank: Optional[int]
    task: Optional[int]
    cells: dict[Optional[int], Cell] = field(default_factory=dict)
    claims: Counter[int] = field(default_factory=Counter)  # global ranks its default-group lines name
    hosts: Counter[str] = field(default_factory=Counter)  # NCCL line hosts
    pid_hosts: dict[int, str] = field(default_factory=dict)
    pid_comm_ranks: dict[int, set[tuple[int, int]]] = field(default_factory=dict)  # pid -> {(comm rank, nranks)}
    ray_ip: Optional[str] = None
    host_tag: Optional[str] = None  # pdsh's `host: ` on its lines

    def cell(self, rank: Optional[int]) -> Cell:
        found = self.cells.get(rank)
        if found is None:
            found = self.cells[rank] = Cell()
        return found


@dataclass(slots=True)
class FileState:
    """One file's reading: its sources for the current run, and the launcher's summary."""

    index: int
    log: LogSource
    sources: dict[SourceKey, Source] = field(default_factory=dict)
    failed: bool = False  # a failure line was read in the current run
    generations: int = 1
    in_summary: bool = False
    summary: dict[str, str] = field(default_factory=dict)
    summary_rank: Optional[int] = None
    summary_hosts: dict[int, str] = field(default_factory=dict)
    summary_exits: dict[int, int] = field(default_factory=dict)
    summary_first: Optional[int] = None
    summary_root_pending: bool = False
    world_sizes: set[int] = field(default_factory=set)
    group_sizes: dict[str, int] = field(default_factory=dict)

    def new_run(self) -> None:
        self.sources.clear()
        self.summary_hosts.clear()
        self.summary_exits.clear()
        self.summary_first = None
        self.failed = False
        self.generations += 1


def read_logs(paths: Iterable[Path], world_size: Optional[int] = None, block_size: int = BLOCK) -> LogEvidence:
    """Read every log under `paths` (`block_size` bytes at a time). LogInputError when
    there is none."""
    paths = list(paths)
    logs = discover_logs(paths)
    if not logs:
        raise LogInputError("no log files found in " + ", ".join(str(p) for p in paths))
    states: list[FileState] = []
    files: list[FileRead] = []
    notes: list[str] = []
    for index, log in enumerate(logs):
        state = FileState(index, log)
        stats = StreamStats()
        try:
            for number, text in read_marked_lines(log.path, stats, block_size):
                _read_line(state, Place(index, number), text)
        except OSError as exc:
            notes.append(f"{log.path}: cannot read ({exc.strerror or exc})")
        if stats.damaged:
            notes.append(f"{log.path}: read up to a damaged or truncated stream ({stats.damaged})")
        if state.generations > 1:
            notes.append(f"{log.path}: holds {state.generations} runs; read the last one")
        states.append(state)
        files.append((log, stats, state.generations))
    return _evidence(states, files, notes, world_size)


# --------------------------------------------------------------------------- one line

def _read_line(state: FileState, place: Place, line: str) -> None:
    for prefix, text in g.segments(line):
        if text:
            _read_segment(state, place, prefix, text)


def _read_segment(state: FileState, place: Place, prefix: g.Prefix, text: str) -> None:
    found = g.events(text)
    if state.in_summary:
        _read_summary(state, text, found)
    if not found:
        return
    header = g.header(text)
    source = _source(state, prefix)
    pg, message_rank = (None, None)
    if any(isinstance(e, (g.Timeout, g.Status, g.Signal, g.Heartbeat, g.GroupInit)) for e in found):
        pg, message_rank = g.group_of(text)
    cell = source.cell(message_rank)
    cell.lines += 1
    if header.at is not None:
        cell.last_at = header.at if cell.last_at is None else max(cell.last_at, header.at)
    for event in found:
        if _starts_run(state, event, pg):
            state.new_run()
            source = _source(state, prefix)
            cell = source.cell(message_rank)
        _apply(state, source, cell, event, pg, message_rank, header, place, text)


def _starts_run(state: FileState, event: g.Event, pg: Optional[g.PgRef]) -> bool:
    if not state.failed:
        return False
    if isinstance(event, g.RunStart) or (isinstance(event, g.Nccl) and event.starts_run):
        return True
    return isinstance(event, g.GroupInit) and g.is_default_group(pg)


def _source(state: FileState, prefix: g.Prefix) -> Source:
    key = (prefix.host, prefix.task, prefix.label, prefix.label_rank, prefix.ray_pid if prefix.label is None else None)
    found = state.sources.get(key)
    if found is None:
        found = state.sources[key] = Source(state.index, state.log.rank, prefix.label, prefix.label_rank, prefix.task)
        found.ray_ip = prefix.ray_ip
        found.host_tag = prefix.host
    return found


def _apply(state: FileState, source: Source, cell: Cell, event: g.Event, pg: Optional[g.PgRef],
           message_rank: Optional[int], header: g.Header, place: Place, text: str) -> None:
    if isinstance(event, (g.Timeout, g.Status, g.Signal, g.Heartbeat)):
        state.failed = True
        if g.is_default_group(pg) and message_rank is not None:
            source.claims[message_rank] += 1
        cell.wordings.update(g.wordings_of(event, text, pg, header))
    if isinstance(event, g.Timeout):
        work = WorkAt(event.seq, event.op, event.numel_in, event.numel_out, event.timeout_ms, event.tensor_shape)
        timed_out = TimedOut(work, event.ran_for_ms, header.at, place)
        if pg is not None:
            _attach_timeout(_position(cell, pg, message_rank), timed_out)
        else:
            cell.pending.append(timed_out)
    elif isinstance(event, g.Status):
        position = _position(cell, pg, message_rank)
        _claim_pending(cell, position, event.at_seq)
        if position.failed_at is None:
            position.failed_at, position.failure = event.at_seq, event.failure
        elif not position.failure:
            position.failure = event.failure
        _note_first(position, header.at, place)
        _take_counts(position, event.last_enqueued, event.last_started, event.last_completed, event.last_started_op)
    elif isinstance(event, g.Signal):
        position = _position(cell, pg, message_rank)
        if position.told is None:
            position.told = Told(event.from_rank, event.by_itself, header.at, place)
        _note_first(position, header.at, place)
        _take_counts(position, event.last_enqueued, None, event.last_completed, "")
    elif isinstance(event, g.Heartbeat):
        if cell.heartbeat_at is None:
            cell.heartbeat_at = header.at
        if event.stuck_s is not None:
            cell.heartbeat_stuck_s = event.stuck_s
        elif cell.heartbeat_stuck_s is None:
            cell.heartbeat_stuck_s = 0
    elif isinstance(event, g.GroupInit):
        if event.global_rank is not None:
            if g.is_default_group(pg) or event.size == 1:
                source.claims[event.global_rank] += 1
        if g.is_default_group(pg):
            state.world_sizes.add(event.size)
        if pg is not None:
            state.group_sizes[pg.name] = event.size
    else:
        _apply_other(state, source, cell, event, header, place)


def _apply_other(state: FileState, source: Source, cell: Cell, event: g.Event, header: g.Header, place: Place) -> None:
    if isinstance(event, g.Nccl):
        source.hosts[event.host] += 1
        source.pid_hosts.setdefault(event.pid, event.host)
        if event.nranks is not None and event.comm_rank is not None:
            source.pid_comm_ranks.setdefault(event.pid, set()).add((event.comm_rank, event.nranks))
            state.world_sizes.add(event.nranks)
        if event.level in ("WARN", "ERROR", "ABORT"):
            cell.warning_count += 1
            if len(cell.warnings) < KEPT_WARNINGS:
                cell.warnings.append(event.text[:300])
            peer = _PEER.search(event.text) if "peer" in event.text else None
            if peer and len(cell.peers_gone) < KEPT_WARNINGS:
                cell.peers_gone.append(peer.group(1))
    elif isinstance(event, g.TracebackStart):
        cell.in_traceback = True
    elif isinstance(event, g.ExceptionLine):
        if cell.in_traceback:
            _end(cell, Ending(event.type, event.message[:300], g.is_collateral(event.type, event.message), header.at,
                              place))
    elif isinstance(event, g.GlooTimeout):
        state.failed = True
        cell.gloo_timeout_ms = event.timeout_ms
    elif isinstance(event, g.PeerClosed):
        if len(cell.peers_gone) < KEPT_WARNINGS:
            cell.peers_gone.append(event.address)
    elif isinstance(event, g.SummaryStart):
        state.failed = True
        state.in_summary = True
        state.summary_root_pending = state.summary_root_pending or event.root_cause
    elif isinstance(event, g.Terminated):
        _end(cell, Ending(event.type, "terminate called", g.is_collateral(event.type, ""), header.at, place))
    elif isinstance(event, g.RunStart):
        pass
    elif isinstance(event, g.WorldSize):
        state.world_sizes.add(event.size)


def _read_summary(state: FileState, text: str, found: list[g.Event]) -> None:
    """torchrun's failure summary: `host : node01`, then `rank : 3 (local_rank: 3)`, then
    `exitcode : -9 (pid: 123)`, one block per failed rank."""
    if text.startswith("=====") and state.summary_rank is not None and not found:
        state.in_summary = False
        return
    for event in found:
        if isinstance(event, g.SummaryStart):
            state.summary_root_pending = state.summary_root_pending or event.root_cause
        if not isinstance(event, g.SummaryField):
            continue
        if event.key == "rank":
            number = event.value.split(" ", 1)[0]
            if number.isdigit():
                rank = int(number)
                state.summary_rank = rank
                host = state.summary.get("host")
                if host:
                    state.summary_hosts[rank] = host
                if state.summary_root_pending:
                    state.summary_first = rank
                    state.summary_root_pending = False
            state.summary.clear()
        elif event.key == "exitcode" and state.summary_rank is not None:
            code = event.value.split(" ", 1)[0]
            if code.lstrip("-").isdigit():
                state.summary_exits[state.summary_rank] = int(code)
        else:
            state.summary[event.key] = event.value


# --------------------------------------------------------------------------- positions

def _position(cell: Cell, pg: Optional[g.PgRef], local_rank: Optional[int]) -> GroupPosition:
    name = pg.name if pg is not None else UNNAMED_GROUP
    position = cell.groups.get(name)
    if position is None:
        position = cell.groups[name] = GroupPosition(name)
    if pg is not None:
        position.desc = position.desc or pg.desc
        if position.local_id is None:
            position.local_id = pg.local_id
    if position.local_rank is None:
        position.local_rank = local_rank
    return position


def _attach_timeout(position: GroupPosition, timed_out: TimedOut) -> None:
    # The same timeout is printed again by the exception that ends the watchdog thread.
    if position.timed_out is None:
        position.timed_out = timed_out
    _note_first(position, timed_out.at, timed_out.place)


def _claim_pending(cell: Cell, position: GroupPosition, seq: int) -> None:
    """A status line names the group of the timeout printed just before it."""
    keep = []
    for timed_out in cell.pending:
        if timed_out.work.seq == seq or timed_out.work.seq is None:
            _attach_timeout(position, timed_out)
        else:
            keep.append(timed_out)
    cell.pending = keep


def _note_first(position: GroupPosition, at: Optional[float], place: Place) -> None:
    if position.first_place is None:
        position.first_place = place
    if at is not None and (position.first_at is None or at < position.first_at):
        position.first_at = at


def _take_counts(position: GroupPosition, enqueued: Optional[int], started: Optional[int],
                 completed: Optional[int], started_op: str) -> None:
    if enqueued is not None:
        if -1 <= enqueued < IMPLAUSIBLE_SEQ:
            position.last_enqueued = enqueued if position.last_enqueued is None else max(position.last_enqueued, enqueued)
        else:
            position.discarded.append(f"last enqueued {enqueued}")
    if started is not None:
        if -1 <= started < IMPLAUSIBLE_SEQ:
            if position.last_started is None or started >= position.last_started:
                position.last_started, position.last_started_op = started, started_op or position.last_started_op
        else:
            position.discarded.append(f"last started {started}")
    if completed is not None:
        ceiling = position.last_enqueued if position.last_enqueued is not None else IMPLAUSIBLE_SEQ
        if -1 <= completed <= ceiling and completed < IMPLAUSIBLE_SEQ:
            position.last_completed = completed if position.last_completed is None else max(position.last_completed, completed)
        else:
            position.discarded.append(f"last completed {completed}")


def _end(cell: Cell, ending: Ending) -> None:
    cell.ending = ending
    if not ending.collateral and cell.first_own_error is None:
        cell.first_own_error = ending


# --------------------------------------------------------------------------- whose lines

def _evidence(states: list[FileState], files: list[FileRead], notes: list[str], given_world: Optional[int]) -> LogEvidence:
    world, world_from = _world_size(states, given_world)
    ranks: dict[int, RankLog] = {}
    unattributed = 0
    file_ranks: dict[int, set[int]] = {state.index: set() for state in states}
    for state in states:
        offset = _node_offset(state, world)
        for source in state.sources.values():
            unattributed += _resolve(source, state, ranks, world, file_ranks[state.index], offset)
        for rank, host in state.summary_hosts.items():
            _rank(ranks, rank, state.index, file_ranks[state.index])
            _set_host(ranks[rank], host, "torchrun's failure summary", strong=True)
        for rank, code in state.summary_exits.items():
            log = _rank(ranks, rank, state.index, file_ranks[state.index])
            log.exit_code = code
            if log.ending is None or log.ending.collateral:
                ending = Ending(g.exit_text(code), "torchrun's failure summary", g.exit_is_collateral(code), None, None)
                if log.ending is None or not ending.collateral:
                    log.ending = ending
                if not ending.collateral and log.first_own_error is None:
                    log.first_own_error = ending
    for state, (log_source, stats, _) in zip(states, files):
        # A rank whose lines held nothing to parse still logged: its file, or its label.
        present = set(stats.labels)
        if log_source.rank is not None and stats.lines:
            present.add(log_source.rank)
        for rank in present:
            _rank(ranks, rank, state.index, file_ranks[state.index])
    for state in states:
        if state.log.host:
            for rank in file_ranks[state.index]:
                _set_host(ranks[rank], state.log.host, f"the name of {Path(state.log.path).name}", strong=False)
    if unattributed:
        notes.append(f"{unattributed} failure line(s) name no rank and come from a log that mixes ranks: left out")
    for log in ranks.values():
        _settle(log)
    launcher_first = next((s.summary_first for s in states if s.summary_first is not None), None)
    log_files = [LogFile(log.path, stats.bytes_read, stats.lines, generations, stats.partial_last_line,
                         tuple(sorted(file_ranks[index])))
                 for index, (log, stats, generations) in enumerate(files)]
    wordings = sorted({w for s in states for src in s.sources.values() for c in src.cells.values() for w in c.wordings})
    return LogEvidence(ranks, log_files, world, world_from, wordings, g.torch_versions(wordings), notes, launcher_first)


def _world_size(states: list[FileState], given: Optional[int]) -> tuple[Optional[int], str]:
    if given:
        return given, "--world-size"
    sizes = {size for state in states for size in state.world_sizes}
    if sizes:
        return max(sizes), "the logs (NCCL communicators, group init options, the launcher)"
    return None, ""


def _rank(ranks: dict[int, RankLog], rank: int, file: int, seen: set[int]) -> RankLog:
    log = ranks.get(rank)
    if log is None:
        log = ranks[rank] = RankLog(rank)
    log.files.add(file)
    seen.add(rank)
    return log


def _resolve(source: Source, state: FileState, ranks: dict[int, RankLog], world: Optional[int], seen: set[int],
             offset: int) -> int:
    """Merge the source's cells into the ranks they speak for; the number of failure
    lines that could not be placed."""
    rank = _source_rank(source, state, world, offset)
    if rank is not None:
        log = _rank(ranks, rank, state.index, seen)
        for cell in source.cells.values():
            _merge(log, cell)
        host = _single_host(source)
        if host:
            _set_host(log, host, "its NCCL lines", strong=True)
        elif source.host_tag:
            _set_host(log, source.host_tag, "its launcher's host tag", strong=False)
        elif source.ray_ip:
            _set_host(log, source.ray_ip, "its Ray worker prefix", strong=False)
        return 0
    lost = 0
    for message_rank, cell in source.cells.items():
        if message_rank is None:
            lost += sum(1 for p in cell.groups.values() if p.failed) + len(cell.pending) + (cell.ending is not None)
            continue
        _merge(_rank(ranks, message_rank, state.index, seen), cell)
    for pid, comms in source.pid_comm_ranks.items():
        world_ranks = [r for r, n in comms if world is not None and n == world]
        host = source.pid_hosts.get(pid)
        if len(world_ranks) == 1 and host:
            _set_host(_rank(ranks, world_ranks[0], state.index, seen), host, "its NCCL init line", strong=True)
    return lost


def _source_rank(source: Source, state: FileState, world: Optional[int] = None, offset: int = 0) -> Optional[int]:
    """The one global rank every line of the source speaks for; None when it mixes ranks.
    `offset` is what a local label is short of the global rank in this file (a node's)."""
    if source.label == "rank":
        return source.label_rank
    if source.claims:
        return next(iter(source.claims)) if len(source.claims) == 1 else None
    in_world = {rank for comms in source.pid_comm_ranks.values() for rank, n in comms if n == world}
    if len(source.pid_comm_ranks) == 1 and len(in_world) == 1:
        return next(iter(in_world))  # its one process's communicator over the whole job
    if source.path_rank is not None and source.label is None and source.task is None:
        return source.path_rank
    named = {rank for rank in source.cells if rank is not None}
    local = source.label_rank if source.label == "local" else source.task
    if local is None and source.label is None:
        local = state.log.local_rank
    if local is not None and (not named or named == {local + offset}):
        return local + offset  # a local label is the global rank on a single node
    # Watchdog lines that all name one rank: the process's own (a node's label, or none).
    return next(iter(named)) if len(named) == 1 else None


def _node_offset(state: FileState, world: Optional[int]) -> int:
    """How far a file's local labels (`[default3]:`) are from global ranks: read off the
    sources whose lines also name their global rank; 0 unless they all agree."""
    offsets = set()
    for source in state.sources.values():
        if source.label != "local" or source.label_rank is None:
            continue
        rank = _source_rank(source, state, world)
        if rank is not None and rank != source.label_rank:
            offsets.add(rank - source.label_rank)
        elif rank == source.label_rank and (source.claims or source.pid_comm_ranks):
            offsets.add(0)
    return offsets.pop() if len(offsets) == 1 else 0


def _single_host(source: Source) -> Optional[str]:
    if not source.hosts:
        return None
    host, _ = source.hosts.most_common(1)[0]
    return host


def _set_host(log: RankLog, host: str, said_by: str, strong: bool) -> None:
    if log.host is None or (strong and log.host_from.startswith("the name")):
        log.host, log.host_from = host, said_by


def _merge(log: RankLog, cell: Cell) -> None:
    log.lines += cell.lines
    for timed_out in cell.pending:
        _attach_timeout(_unnamed(log), timed_out)
    for name, position in cell.groups.items():
        mine = log.groups.get(name)
        if mine is None:
            log.groups[name] = position
        else:
            _merge_position(mine, position)
    if cell.ending is not None and (log.ending is None or _later(cell.ending, log.ending)):
        log.ending = cell.ending
    if cell.first_own_error is not None and (log.first_own_error is None or _later(log.first_own_error, cell.first_own_error)):
        log.first_own_error = cell.first_own_error
    if cell.heartbeat_stuck_s is not None:
        log.heartbeat_stuck_s = max(log.heartbeat_stuck_s or 0, cell.heartbeat_stuck_s)
        log.heartbeat_at = cell.heartbeat_at if log.heartbeat_at is None else log.heartbeat_at
    log.gloo_timeout_ms = log.gloo_timeout_ms or cell.gloo_timeout_ms
    log.nccl_warning_count += cell.warning_count
    log.nccl_warnings.extend(cell.warnings[: max(0, KEPT_WARNINGS - len(log.nccl_warnings))])
    log.peers_gone.extend(cell.peers_gone[: max(0, KEPT_WARNINGS - len(log.peers_gone))])
    if cell.last_at is not None:
        log.last_at = cell.last_at if log.last_at is None else max(log.last_at, cell.last_at)


def _unnamed(log: RankLog) -> GroupPosition:
    position = log.groups.get(UNNAMED_GROUP)
    if position is None:
        position = log.groups[UNNAMED_GROUP] = GroupPosition(UNNAMED_GROUP)
    return position


def _merge_position(mine: GroupPosition, other: GroupPosition) -> None:
    if mine.timed_out is None or (other.timed_out is not None and _earlier_place(other.timed_out.place, mine.timed_out.place)):
        mine.timed_out = other.timed_out or mine.timed_out
    if mine.failed_at is None:
        mine.failed_at, mine.failure = other.failed_at, other.failure
    if mine.told is None:
        mine.told = other.told
    mine.desc = mine.desc or other.desc
    mine.local_id = mine.local_id if mine.local_id is not None else other.local_id
    mine.local_rank = mine.local_rank if mine.local_rank is not None else other.local_rank
    _take_counts(mine, other.last_enqueued, other.last_started, other.last_completed, other.last_started_op)
    mine.discarded.extend(other.discarded)
    if other.first_place is not None:
        _note_first(mine, other.first_at, other.first_place)


def _earlier_place(a: Place, b: Place) -> bool:
    return a.file == b.file and a.line < b.line


def _later(a: Ending, b: Ending) -> bool:
    """Whether ending `a` was written after `b` (by time, else by place in one file)."""
    if a.at is not None and b.at is not None:
        return a.at > b.at
    if a.place is not None and b.place is not None and a.place.file == b.place.file:
        return a.place.line > b.place.line
    return False


def _settle(log: RankLog) -> None:
    """The rank's first failure: its earliest failure line, or an exception of its own."""
    candidates = [(p.first_at, p.first_place) for p in log.groups.values() if p.failed or p.told]
    if log.first_own_error is not None:
        candidates.append((log.first_own_error.at, log.first_own_error.place))
    if log.heartbeat_at is not None:
        candidates.append((log.heartbeat_at, None))
    timed = [(at, place) for at, place in candidates if at is not None]
    if timed:
        log.first_failure_at, log.first_failure_place = min(timed, key=lambda c: c[0])
    elif candidates:
        log.first_failure_place = next((c[1] for c in candidates if c[1] is not None), None)
