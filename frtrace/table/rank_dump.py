"""One rank's dump as frtrace keeps it: its entries in an `EntryTable` and what the dump
says of its groups.

Takes what the loader read from one file; returns a `RankDump` (Entry tuples given for
`entries`, as tests and hand-made dumps do, are stored as a table); and a job's load as a
whole, `LoadResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from frtrace.model import LoadIssue, PgConfig, PgStatus
from frtrace.table.entry_table import EntryTable


@dataclass(slots=True)
class RankDump:
    """Everything frtrace keeps from one rank's dump file."""

    rank: int
    path: str
    encoding: str  # pickle | json, with "+gzip" when compressed
    version: str
    comm_lib_version: str
    pg_config: tuple[PgConfig, ...]
    pg_status: dict[int, PgStatus]  # rank-local pg_id -> its status
    entries: EntryTable  # oldest first (Entry tuples given here are stored as a table)
    has_entries: bool  # False when the dump was taken without collectives
    warnings: tuple[str, ...] = ()
    # Entries dropped because where they stand (their collective_seq_id) could not be read.
    unreadable_entries: int = 0
    writer: str = "c10d"  # who wrote the dump: c10d's Flight Recorder, or "cupti_monitor"
    # The clock of its times: "wall" (the host's wall clock; ranks compare, NTP apart) or
    # "cupti" (CUPTI's native timestamps, counted from an origin of each host's own).
    clock: str = "wall"
    # Whether the window may not reach back to the job's first ops, where the record ids do
    # not say (the CUPTI monitor's are correlation ids); None: read off the record ids.
    window_clipped: Optional[bool] = None

    @property
    def backend(self) -> str:
        return next((name.backend for name in self.entries.static_values("name") if name.backend), "")

    @property
    def wrapped(self) -> bool:
        """The ring buffer overwrote older entries (its oldest record id is not 0)."""
        if self.window_clipped is not None:
            return self.window_clipped and bool(self.entries)
        return bool(self.entries) and self.entries.value("record_id", 0) > 0

    @property
    def has_frames(self) -> bool:
        return any(self.entries.static_values("frames"))

    def __post_init__(self) -> None:
        if not isinstance(self.entries, EntryTable):  # Entry tuples (a test, a hand-made dump)
            self.entries = EntryTable.from_entries(self.entries)


def clocks_compare(dumps: Iterable[RankDump]) -> bool:
    """Whether times of different ranks' dumps can be compared: every dump is on a wall clock."""
    return all(dump.clock == "wall" for dump in dumps)


@dataclass(slots=True)
class LoadResult:
    """What loading a job's dumps gave: a RankDump per usable file, and what was not used."""

    dumps: list[RankDump]  # sorted by rank
    skipped: list[LoadIssue] = field(default_factory=list)  # unrelated files
    errors: list[LoadIssue] = field(default_factory=list)  # dump files that could not be read
    prefix: str = ""
    # ranks whose file was found but unusable; they count as missing dumps
    failed_ranks: tuple[int, ...] = ()
    # for the user, one line each: several generations of dumps found, and which one was read
    notes: list[str] = field(default_factory=list)
    # the directories and files the dumps were looked for in, as given
    inputs: tuple[str, ...] = ()
