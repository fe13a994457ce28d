"""One rank's dump as frtrace keeps it: its entries in an `EntryTable` and what the dump
says of its groups.

Takes what the loader read from one file; returns a `RankDump` (Entry tuples given for
`entries`, as tests and hand-made dumps do, are stored as a table).
"""

from __future__ import annotations

from dataclasses import dataclass

from frtrace.model import PgConfig, PgStatus
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

    @property
    def backend(self) -> str:
        return next((name.backend for name in self.entries.static_values("name") if name.backend), "")

    @property
    def wrapped(self) -> bool:
        """The ring buffer overwrote older entries (its oldest record id is not 0)."""
        return bool(self.entries) and self.entries.value("record_id", 0) > 0

    @property
    def has_frames(self) -> bool:
        return any(self.entries.static_values("frames"))

    def __post_init__(self) -> None:
        if not isinstance(self.entries, EntryTable):  # Entry tuples (a test, a hand-made dump)
            self.entries = EntryTable.from_entries(self.entries)
