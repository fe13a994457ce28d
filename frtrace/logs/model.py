"""What a job's logs say, as plain data: where each rank stood in each process group.

The reader (`collect.read_logs`) returns a `LogEvidence`: one `RankLog` per rank the logs
speak for, each with a `GroupPosition` per process group its watchdog lines named (the
op it timed out in, with sizes and timeout; last enqueued / started / completed work;
whether another rank told it to dump), how it ended (a Python exception, a signal), its
host, and NCCL warnings. Times are seconds on the job's wall clock (the year is often
not in the log: only differences between them mean anything).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

# The group key of watchdog lines that name no process group (torch before 2.3 wrote
# `[Rank N]` only): their sequence numbers are those of whatever group timed out.
UNNAMED_GROUP = ""


class Place(NamedTuple):
    """Where a line was read: its file and line number (1-based); orders lines of one file."""

    file: int  # index into LogEvidence.files
    line: int


class WorkAt(NamedTuple):
    """An op as the watchdog printed it: `WorkNCCL(SeqNum=.., OpType=.., NumelIn=.., ...)`."""

    seq: Optional[int]  # None: torch before 1.10 printed no SeqNum
    op: str  # OpType as printed: ALLREDUCE, _ALLGATHER_BASE, BROADCAST, ...
    numel_in: Optional[int]
    numel_out: Optional[int]
    timeout_ms: Optional[int]
    tensor_shape: Optional[str] = None  # torch 1.x printed the output's shape instead of numels


class TimedOut(NamedTuple):
    work: WorkAt
    ran_for_ms: Optional[int]
    at: Optional[float]  # when the watchdog said so (seconds), if the line carries a time
    place: Place


class Told(NamedTuple):
    """A rank told to dump its Flight Recorder because some rank failed."""

    from_rank: Optional[int]  # the rank that signalled, when the line says
    by_itself: bool  # the failure was this rank's own (`from this local rank`)
    at: Optional[float]
    place: Place


@dataclass(slots=True)
class GroupPosition:
    """One rank's position in one process group, as its watchdog lines give it."""

    name: str  # the group's name (PG GUID, or `PG N` before torch 2.5); UNNAMED_GROUP if none
    desc: str = ""
    local_id: Optional[int] = None  # `PG ID` (torch 2.5+): the pg_id of Flight Recorder dumps
    local_rank: Optional[int] = None  # the rank within the group the lines named
    timed_out: Optional[TimedOut] = None
    failed_at: Optional[int] = None  # the work the watchdog reported a failure at
    failure: str = ""  # timeout | error | "" (the line does not say which)
    last_enqueued: Optional[int] = None
    last_started: Optional[int] = None
    last_started_op: str = ""
    last_completed: Optional[int] = None
    told: Optional[Told] = None
    # Values torch printed that cannot be right (uninitialised counters, 2.3): kept out.
    discarded: list[str] = field(default_factory=list)
    first_at: Optional[float] = None  # time of the first failure line about this group
    first_place: Optional[Place] = None

    @property
    def failed(self) -> bool:
        return self.timed_out is not None or self.failed_at is not None

    @property
    def reached(self) -> Optional[int]:
        """The newest op the rank is known to have enqueued in this group (None: unknown)."""
        known = [n for n in (self.last_enqueued, self.failed_at,
                             self.timed_out.work.seq if self.timed_out else None) if n is not None]
        return max(known) if known else None


class Ending(NamedTuple):
    """How a rank's process ended, as far as its log says."""

    what: str  # exception type, `signal SIGKILL`, `exit code 1`
    message: str
    # Another rank's failure explains it (a communicator aborted, a peer gone, the
    # launcher's SIGTERM): not where the trouble began.
    collateral: bool
    at: Optional[float]
    place: Optional[Place]


@dataclass(slots=True)
class RankLog:
    rank: int
    host: Optional[str] = None
    host_from: str = ""  # which line or name said so
    files: set[int] = field(default_factory=set)
    lines: int = 0  # lines of this rank that frtrace read (not every line of its output)
    groups: dict[str, GroupPosition] = field(default_factory=dict)
    ending: Optional[Ending] = None  # the last exception or exit that ended it
    first_own_error: Optional[Ending] = None  # the first exception that was not collateral
    exit_code: Optional[int] = None  # from the launcher's failure summary
    heartbeat_stuck_s: Optional[int] = None  # the heartbeat monitor found its watchdog stuck this long
    heartbeat_at: Optional[float] = None
    gloo_timeout_ms: Optional[int] = None
    nccl_warnings: list[str] = field(default_factory=list)  # the first few NCCL WARN lines
    nccl_warning_count: int = 0
    peers_gone: list[str] = field(default_factory=list)  # peers a connection to closed (address)
    last_at: Optional[float] = None  # the newest time on any line read for it
    first_failure_at: Optional[float] = None
    first_failure_place: Optional[Place] = None

    @property
    def failed(self) -> bool:
        return any(g.failed for g in self.groups.values())


class LogFile(NamedTuple):
    path: str
    bytes_read: int
    lines: int
    generations: int  # runs found in it; only the last one was read
    partial_last_line: bool
    ranks: tuple[int, ...]


@dataclass(slots=True)
class LogEvidence:
    ranks: dict[int, RankLog]
    files: list[LogFile]
    world_size: Optional[int]  # from the logs (NCCL communicators, group sizes) or given
    world_size_from: str
    # The watchdog wordings seen (keys of grammar.WORDINGS, see docs/logs.md), and the
    # torch versions that write all of them (`2.5`, `2.6+`; "" when they disagree).
    wordings: list[str] = field(default_factory=list)
    torch_versions: str = ""
    notes: list[str] = field(default_factory=list)  # what the reader could not use, in a line each
    launcher_first_failure: Optional[int] = None  # the rank torchrun called the root cause

    @property
    def job_ranks(self) -> tuple[int, ...]:
        top = (self.world_size or 0) - 1
        if self.ranks:
            top = max(top, max(self.ranks))
        return tuple(range(top + 1))

    @property
    def silent_ranks(self) -> tuple[int, ...]:
        """Ranks of the job that no line read speaks for."""
        return tuple(r for r in self.job_ranks if r not in self.ranks)

    def host_of(self, rank: int) -> Optional[str]:
        log = self.ranks.get(rank)
        return log.host if log else None
