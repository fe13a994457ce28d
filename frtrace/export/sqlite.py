"""Write the Database, the findings and the per-rank inputs to one SQLite file.

Takes a path (the temporary file `outputs.write_atomically` renames into place), the
`Analysis` and the `Diagnosis`; returns nothing. Tables: `meta`, `ranks`, `groups`,
`memberships`, `tracebacks`, `frames`, `collectives`, `ncclcalls`, `findings`, and
`rank_positions` (where each rank stands in each of its groups, worked out from the
dumps at export time, so "where is each rank" is a lookup, not a scan). Ids
are the Database's own (`database.build_database`), so they join the same way as in
the pickle; tuples (sizes, dtypes, rank lists) are stored as JSON text so that
`json_extract` and `json_each` work on them.

Built for ~10M `ncclcalls` rows: rows are streamed into `executemany` from the
Database lists (no second copy), inside one transaction, with indexes created after
the data and no rollback journal (the file is a temporary one until it is complete).
The same dumps give the same rows: no timestamps of the export itself are stored, and
file paths (`ranks.path`, `ranks.problem`) are relative to the input root, the deepest
directory holding every input, which `meta.input_root` records as given.

SQLite integers are 64-bit signed; a dump may hold integers up to 2**64 (a corrupt
timestamp, line number or id). Such a value is stored as a BLOB of its decimal digits
(`CAST(col AS TEXT)` reads it back): TEXT would be turned into a lossy REAL by the
INTEGER columns, and the export must neither fail nor round.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Callable, Final, Iterable, Iterator, NamedTuple, Optional, Union

from frtrace._version import __version__
from frtrace.diagnosis import Diagnosis, Finding
from frtrace.export.database import build_database
from frtrace.load.discovery import parse_rank_from_name
from frtrace.match.analysis import Analysis
from frtrace.model import Collective, Entry, Group, NCCLCall, Traceback
from frtrace.table.rank_dump import LoadResult
from frtrace.table.standing import blocked_at
from frtrace.wording import printable

SCHEMA_VERSION = "frtrace.sqlite/1"

SCHEMA = """
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE ranks (
    rank INTEGER PRIMARY KEY,
    has_dump INTEGER NOT NULL,
    path TEXT,
    encoding TEXT,
    version TEXT,
    backend TEXT,
    comm_lib_version TEXT,
    entry_count INTEGER,
    first_record_id INTEGER,
    last_record_id INTEGER,
    first_time_created_ns INTEGER,
    last_time_created_ns INTEGER,
    wrapped INTEGER,
    has_entries INTEGER,
    problem TEXT
);
CREATE TABLE groups (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    desc TEXT,
    ranks TEXT,
    size INTEGER,
    membership_source TEXT
);
CREATE TABLE memberships (
    group_id INTEGER NOT NULL REFERENCES groups(id),
    global_rank INTEGER NOT NULL REFERENCES ranks(rank),
    local_rank INTEGER NOT NULL,
    PRIMARY KEY (group_id, local_rank)
);
CREATE TABLE tracebacks (
    id INTEGER PRIMARY KEY,
    frame_count INTEGER NOT NULL,
    frames TEXT NOT NULL
);
CREATE TABLE frames (
    traceback_id INTEGER NOT NULL REFERENCES tracebacks(id),
    depth INTEGER NOT NULL,
    name TEXT,
    filename TEXT,
    line INTEGER,
    PRIMARY KEY (traceback_id, depth)
);
CREATE TABLE collectives (
    id INTEGER PRIMARY KEY,
    group_id INTEGER NOT NULL REFERENCES groups(id),
    kind TEXT NOT NULL,
    collective_seq_id INTEGER,
    p2p_seq_id INTEGER,
    op TEXT,
    input_sizes TEXT,
    output_sizes TEXT,
    input_dtypes TEXT,
    output_dtypes TEXT,
    expected_ranks TEXT,
    issued_ranks TEXT,
    completed_ranks TEXT,
    not_issued_ranks TEXT,
    no_dump_ranks TEXT,
    out_of_window_ranks TEXT,
    state TEXT NOT NULL,
    problem TEXT
);
CREATE TABLE ncclcalls (
    id INTEGER PRIMARY KEY,
    collective_id INTEGER NOT NULL REFERENCES collectives(id),
    group_id INTEGER NOT NULL REFERENCES groups(id),
    global_rank INTEGER NOT NULL REFERENCES ranks(rank),
    record_id INTEGER,
    profiling_name TEXT,
    op TEXT,
    collective_seq_id INTEGER,
    p2p_seq_id INTEGER,
    op_id INTEGER,
    input_sizes TEXT,
    output_sizes TEXT,
    input_dtypes TEXT,
    output_dtypes TEXT,
    state TEXT,
    retired INTEGER,
    time_created_ns INTEGER,
    time_started_ns INTEGER,
    time_completed_ns INTEGER,
    duration_ms REAL,
    timeout_ms INTEGER,
    traceback_id INTEGER REFERENCES tracebacks(id)
);
CREATE TABLE findings (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    rule TEXT NOT NULL,
    severity TEXT NOT NULL,
    root_cause INTEGER NOT NULL,
    pg_name TEXT,
    pg_desc TEXT,
    group_id INTEGER REFERENCES groups(id),
    collective_id INTEGER REFERENCES collectives(id),
    op TEXT,
    collective_seq_id INTEGER,
    p2p_seq_id INTEGER,
    ranks TEXT,
    suspect_ranks TEXT,
    waiting_ranks TEXT,
    message TEXT,
    evidence TEXT
);
CREATE TABLE rank_positions (
    rank INTEGER NOT NULL REFERENCES ranks(rank),
    group_id INTEGER NOT NULL REFERENCES groups(id),
    pg_name TEXT,
    pg_desc TEXT,
    position TEXT NOT NULL,
    blocked_here INTEGER NOT NULL,
    blocked_call_id INTEGER REFERENCES ncclcalls(id),
    blocked_op TEXT,
    blocked_collective_seq_id INTEGER,
    blocked_p2p_seq_id INTEGER,
    blocked_state TEXT,
    blocked_time_created_ns INTEGER,
    blocked_time_started_ns INTEGER,
    unfinished_after INTEGER,
    last_completed_call_id INTEGER REFERENCES ncclcalls(id),
    last_completed_op TEXT,
    last_completed_collective_seq_id INTEGER,
    last_completed_p2p_seq_id INTEGER,
    last_completed_time_ns INTEGER,
    newest_call_id INTEGER REFERENCES ncclcalls(id),
    entries INTEGER NOT NULL,
    PRIMARY KEY (rank, group_id)
);
"""

# Created after the rows are in: one sort per index instead of a b-tree update per row.
INDEXES = """
CREATE INDEX memberships_global_rank ON memberships(global_rank);
CREATE INDEX collectives_group_seq ON collectives(group_id, collective_seq_id);
CREATE INDEX ncclcalls_collective ON ncclcalls(collective_id, time_created_ns, time_completed_ns, duration_ms);
CREATE INDEX ncclcalls_group_seq ON ncclcalls(group_id, collective_seq_id);
CREATE INDEX ncclcalls_group_state ON ncclcalls(group_id, state, retired);
CREATE INDEX ncclcalls_global_rank ON ncclcalls(global_rank, time_created_ns);
CREATE INDEX ncclcalls_traceback ON ncclcalls(traceback_id);
CREATE INDEX findings_group ON findings(group_id);
"""

# NCCLCall fields input_sizes, output_sizes, input_dtypes, output_dtypes: the
# `ncclcalls` columns follow NCCLCall's field order, these four as JSON text. Written as
# numbers, so that mypy knows what each slice of a row holds; checked against the fields.
_SHAPES_START: Final = 10
_SHAPES_STOP: Final = 14  # the state, after them
_AFTER_STATE: Final = 15
assert NCCLCall._fields[_SHAPES_START:_AFTER_STATE] == ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
                                                        "state")

# Distinct shapes, dtype lists and rank lists are few and shared by many rows (the
# loader interns them), so their JSON text is worth caching; the cap bounds memory on
# pathological inputs where every row differs.
_JSON_CACHE_LIMIT = 200_000
_SQLITE_INT_LIMIT = 2**63
# A value of a column as sqlite3 takes it, and a table's row.
SqlValue = Union[None, int, float, str, bytes]
Row = tuple[SqlValue, ...]
# (rank, group id, record id): one rank's call in one group.
CallKey = tuple[int, int, int]


class _JsonText:
    """`json.dumps` of tuples, cached by value."""

    def __init__(self) -> None:
        self.cache: dict[tuple[object, ...], str] = {}

    def __call__(self, value: Optional[tuple[object, ...]]) -> Optional[str]:
        if value is None:
            return None
        text = self.cache.get(value)
        if text is None:
            if len(self.cache) >= _JSON_CACHE_LIMIT:
                self.cache.clear()
            text = self.cache[value] = json.dumps(value, separators=(",", ":"))
        return text


def _dumps(value: object) -> str:
    # Evidence is plain data; `default=str` keeps an odd value from failing the export.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


# --------------------------------------------------------------------------- rows


def input_root(inputs: Iterable[str]) -> Optional[str]:
    """The deepest directory holding every input (a file input counts as its directory),
    spelled as given where the inputs allow; None without inputs or a common directory."""
    directories = [path if os.path.isdir(path) else os.path.dirname(path) or "." for path in inputs]
    if not directories:
        return None
    try:
        return os.path.commonpath(directories)
    except ValueError:  # absolute and relative inputs mixed, or two drives
        try:
            return os.path.commonpath([os.path.abspath(d) for d in directories])
        except ValueError:
            return None


def _relative(path: str, root: Optional[str]) -> str:
    # The same dumps in two places (or reached by two spellings) give the same rows.
    if root is None:
        return path
    try:
        return Path(os.path.relpath(path, root)).as_posix()
    except ValueError:  # on another drive
        return path


def _meta_rows(analysis: Analysis, diagnosis: Diagnosis, root: Optional[str]) -> list[Row]:
    layout = analysis.layout
    return [
        ("input_root", root),
        ("schema", SCHEMA_VERSION),
        ("frtrace_version", __version__),
        ("status", diagnosis.status),
        ("suspect_ranks", _dumps(list(diagnosis.suspect_ranks))),
        ("verdict", diagnosis.verdict),
        ("world_size", str(layout.world_size)),
        ("ranks_found", _dumps(list(layout.ranks_found))),
        ("ranks_missing", _dumps(list(layout.ranks_missing))),
    ]


def _load_problems(load: LoadResult, root: Optional[str]) -> dict[int, str]:
    """rank -> why its dump file could not be used, from the loader's errors."""
    problems: dict[int, str] = {}
    for issue in load.errors:
        parsed = parse_rank_from_name(Path(issue.path).name, load.prefix or None)
        if parsed is not None:
            problems.setdefault(parsed[1], f"{_relative(issue.path, root)}: {issue.problem}")
    return problems


def _rank_rows(analysis: Analysis, extra_ranks: Iterable[int], root: Optional[str]) -> Iterator[Row]:
    """One row per rank of the world, with or without a dump."""
    dumps = {d.rank: d for d in analysis.layout.usable(analysis.load.dumps)}
    problems = _load_problems(analysis.load, root)
    failed = set(analysis.load.failed_ranks)
    everyone = set(range(analysis.layout.world_size)) | set(dumps) | set(extra_ranks)
    for rank in sorted(everyone):
        dump = dumps.get(rank)
        if dump is None:
            problem = problems.get(rank) or ("unreadable dump" if rank in failed else "no dump file")
            yield (rank, 0, None, None, None, None, None, None, None, None, None, None, None, None, problem)
            continue
        entries = dump.entries
        created = [e.time_created_ns for e in entries]
        yield (
            rank, 1, _relative(dump.path, root), dump.encoding, dump.version, dump.backend, dump.comm_lib_version,
            len(entries),
            entries[0].record_id if entries else None,
            entries[-1].record_id if entries else None,
            min(created) if created else None,
            max(created) if created else None,
            int(dump.wrapped), int(dump.has_entries), None,
        )


def _group_rows(groups: list[Group], as_json: _JsonText) -> Iterator[Row]:
    for g in groups:
        yield (g.id, g.name, g.desc, as_json(g.ranks), g.size, g.membership_source)


def _traceback_rows(tracebacks: list[Traceback]) -> Iterator[Row]:
    for tb in tracebacks:
        frames = [{"name": f.name, "filename": f.filename, "line": f.line} for f in tb.frames]
        yield (tb.id, len(frames), json.dumps(frames, separators=(",", ":")))


def _frame_rows(tracebacks: list[Traceback]) -> Iterator[Row]:
    # depth 0 is the innermost frame, as in the dumps.
    for tb in tracebacks:
        for depth, frame in enumerate(tb.frames):
            yield (tb.id, depth, frame.name, frame.filename, frame.line)


def _collective_rows(collectives: list[Collective], as_json: _JsonText) -> Iterator[Row]:
    for c in collectives:
        yield (
            c.id, c.group_id, c.kind, c.collective_seq_id, c.p2p_seq_id, c.op,
            as_json(c.input_sizes), as_json(c.output_sizes), as_json(c.input_dtypes), as_json(c.output_dtypes),
            as_json(c.expected_ranks), as_json(c.issued_ranks), as_json(c.completed_ranks),
            as_json(c.not_issued_ranks), as_json(c.no_dump_ranks), as_json(c.out_of_window_ranks),
            c.state, c.problem,
        )


def _call_rows(calls: list[NCCLCall]) -> Iterator[Row]:
    # The hot loop (one pass per row of ~10M): the row is the NCCLCall itself with its
    # four shape/dtype tuples swapped for JSON text. Those tuples are interned by the
    # loader, so their JSON is cached by object identity (the rows keep every object
    # alive until the export ends, so an id cannot be reused meanwhile); so is whether
    # the row's strings (profiling name, op, state: interned too) print as they are.
    # ids of the tuples and strings -> (the shapes' JSON, the strings made printable; None: as they are)
    cache: dict[tuple[int, ...], tuple[tuple[str, ...], Optional[tuple[str, ...]]]] = {}
    dumps = json.dumps
    for c in calls:
        key = (id(c.input_sizes), id(c.output_sizes), id(c.input_dtypes), id(c.output_dtypes), id(c.profiling_name),
               id(c.op), id(c.state))
        cached = cache.get(key)
        if cached is None:
            if len(cache) >= _JSON_CACHE_LIMIT:
                cache.clear()
            escaped = tuple(map(printable, (c.profiling_name, c.op, c.state)))
            cached = cache[key] = (tuple(dumps(v, separators=(",", ":")) for v in c[_SHAPES_START:_SHAPES_STOP]),
                                   None if escaped == (c.profiling_name, c.op, c.state) else escaped)
        shapes, texts = cached
        if texts is None:
            yield c[:_SHAPES_START] + shapes + c[_SHAPES_STOP:]
        else:
            yield c[:5] + texts[:2] + c[7:_SHAPES_START] + shapes + texts[2:] + c[_AFTER_STATE:]


def _finding_rows(findings: list[Finding], collectives: list[Collective]) -> Iterator[Row]:
    collective_ids = {(c.group_id, c.collective_seq_id): c.id for c in collectives if c.kind == "collective"}
    for index, f in enumerate(findings):
        collective_id = None
        if f.group_id is not None and f.collective_seq_id is not None:
            collective_id = collective_ids.get((f.group_id, f.collective_seq_id))
        yield (
            index, f.kind, f.rule, f.severity, int(f.is_root), f.pg_name, f.pg_desc, f.group_id, collective_id,
            f.op, f.collective_seq_id, f.p2p_seq_id,
            _dumps(list(f.ranks)), _dumps(list(f.suspect_ranks)), _dumps(list(f.waiting_ranks)),
            f.message, _dumps(f.evidence),
        )


class _Position(NamedTuple):
    """Where one rank stands in one group, from its own entries of that group."""

    rank: int
    group_id: int
    entries: tuple[Entry, ...]  # the rank's entries of the group, oldest first
    blocked_index: int  # in `entries`: the oldest unfinished entry after the newest completed one (len: none)
    last_completed: Optional[Entry]
    blocked_here: bool  # the rank as a whole is blocked in `blocked`


def _positions(analysis: Analysis) -> list[_Position]:
    """One `_Position` per (rank with a dump, group it has entries of), by rank and group."""
    layout = analysis.layout
    out: list[_Position] = []
    for dump in layout.usable(analysis.load.dumps):
        by_group: defaultdict[int, list[Entry]] = defaultdict(list)
        for entry in dump.entries:
            gid = layout.group_of(entry.pg_name, dump.rank)
            if gid is not None:
                by_group[gid].append(entry)
        at = blocked_at(dump.entries)
        rank_blocked = dump.entries[at] if at < len(dump.entries) else None
        for gid in sorted(by_group):
            entries = tuple(by_group[gid])
            index = blocked_at(entries)
            done = next((e for e in reversed(entries[:index]) if e.completed), None)
            here = index < len(entries) and entries[index] == rank_blocked
            out.append(_Position(dump.rank, gid, entries, index, done, here))
    return out


def _call_ids(calls: list[NCCLCall], wanted: set[CallKey]) -> dict[CallKey, int]:
    """(rank, group id, record id) -> ncclcalls id, for the `wanted` keys only."""
    found: dict[CallKey, int] = {}
    for c in calls:
        key = (c.global_rank, c.group_id, c.record_id)
        if key in wanted and key not in found:
            found[key] = c.id
    return found


def _seq_ids(entry: Optional[Entry]) -> tuple[Optional[int], Optional[int]]:
    """(collective_seq_id, p2p_seq_id) with the one that does not number this op left NULL."""
    if entry is None:
        return None, None
    return (None, entry.p2p_seq_id) if entry.is_p2p else (entry.collective_seq_id, None)


def _position_rows(positions: list[_Position], groups: list[Group], calls: list[NCCLCall]) -> Iterator[Row]:
    def key(p: _Position, e: Entry) -> CallKey:
        return (p.rank, p.group_id, e.record_id)

    def call_id(p: _Position, e: Optional[Entry]) -> Optional[int]:
        return None if e is None else ids.get(key(p, e))

    def blocked(p: _Position) -> Optional[Entry]:
        return p.entries[p.blocked_index] if p.blocked_index < len(p.entries) else None

    wanted = {key(p, e) for p in positions for e in (blocked(p), p.last_completed, p.entries[-1]) if e is not None}
    ids = _call_ids(calls, wanted)
    names = {g.id: g for g in groups}
    for p in positions:
        group, b, done = names[p.group_id], blocked(p), p.last_completed
        unfinished_after = sum(1 for e in p.entries[p.blocked_index + 1:] if not e.completed)
        yield (
            p.rank, p.group_id, group.name, group.desc, "blocked" if b is not None else "idle", int(p.blocked_here),
            call_id(p, b), b and b.op, *_seq_ids(b), b and b.state,
            b and b.time_created_ns, b and b.time_started_ns, unfinished_after,
            call_id(p, done), done and done.op, *_seq_ids(done),
            done and (done.time_completed_ns or done.time_created_ns),
            ids.get(key(p, p.entries[-1])), len(p.entries),
        )


# --------------------------------------------------------------------------- writer


def _printable_row(row: Row) -> Row:
    """The row with every string as `wording.printable` shows it: a dump's control and
    bidi characters reach no terminal that prints a query's result."""
    return tuple(printable(value) if type(value) is str else value for value in row)


def _storable(value: SqlValue) -> SqlValue:
    """A value SQLite can store as it is: text UTF-8 cannot hold (a lone surrogate from a
    JSON '\\udcff' escape, or a file name that is not UTF-8) gets that escape spelled out;
    an integer beyond 64 bits becomes a BLOB of its digits (see the module docstring)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if type(value) is int and not -_SQLITE_INT_LIMIT <= value < _SQLITE_INT_LIMIT:
        return str(value).encode("ascii")
    return value


def _insert(conn: sqlite3.Connection, table: str, width: int, make_rows: Callable[[], Iterable[Row]],
            escaped: bool = False) -> None:
    """Insert the rows `make_rows()` yields into the new, empty `table`, each string made
    printable (`_printable_row`) unless `escaped` says the rows are already. Values SQLite
    cannot take as they are (see `_storable`) are rare, so they are looked for only when
    the fast pass meets one: the table is then emptied (without a journal there is no
    ROLLBACK) and refilled from fresh rows with every value made storable."""
    statement = f"INSERT INTO {table} VALUES ({','.join('?' * width)})"
    def rows() -> Iterable[Row]:
        return make_rows() if escaped else map(_printable_row, make_rows())

    try:
        conn.executemany(statement, rows())
    except (UnicodeEncodeError, OverflowError):
        conn.execute(f"DELETE FROM {table}")
        conn.executemany(statement, (tuple(map(_storable, row)) for row in rows()))


def write_sqlite(path_tmp: str, analysis: Analysis, diagnosis: Diagnosis) -> None:
    """Write every table into the (new, empty or absent) SQLite file `path_tmp`."""
    db = build_database(analysis.matches)
    as_json = _JsonText()
    member_ranks = {m.global_rank for m in db.memberships}
    root = input_root(analysis.load.inputs)
    conn = sqlite3.connect(path_tmp, isolation_level=None)
    try:
        # The file only becomes the output after a successful rename, so durability
        # and a rollback journal buy nothing here and cost a lot on big inserts.
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        for statement in _statements(SCHEMA):
            conn.execute(statement)
        _insert(conn, "meta", 2, lambda: _meta_rows(analysis, diagnosis, root))
        _insert(conn, "ranks", 15, lambda: _rank_rows(analysis, member_ranks, root))
        _insert(conn, "groups", 6, lambda: _group_rows(db.groups, as_json))
        _insert(conn, "memberships", 3, lambda: ((m.group_id, m.global_rank, m.local_rank) for m in db.memberships),
                escaped=True)
        _insert(conn, "tracebacks", 3, lambda: _traceback_rows(db.tracebacks))
        _insert(conn, "frames", 5, lambda: _frame_rows(db.tracebacks))
        _insert(conn, "collectives", 18, lambda: _collective_rows(db.collectives, as_json))
        _insert(conn, "ncclcalls", len(NCCLCall._fields), lambda: _call_rows(db.ncclcalls), escaped=True)
        _insert(conn, "findings", 17, lambda: _finding_rows(diagnosis.findings, db.collectives))
        positions = _positions(analysis)
        _insert(conn, "rank_positions", 21, lambda: _position_rows(positions, db.groups, db.ncclcalls))
        for statement in _statements(INDEXES):
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _statements(script: str) -> list[str]:
    # `executescript` would commit the open transaction first; run statements one by one.
    return [s.strip() for s in script.split(";") if s.strip()]
