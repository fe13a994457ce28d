import json
import pickle
import sqlite3

import pytest
from click.testing import CliRunner
from helpers import nccl_hang_dumps, write_job, write_json

from frtrace.cli.analyse import frtrace
from frtrace.diagnosis import diagnose
from frtrace.export import outputs
from frtrace.export.database import build_database
from frtrace.export.outputs import OutputError, write_output
from frtrace.match.analysis import analyze

TABLES = ("meta", "ranks", "groups", "memberships", "tracebacks", "frames", "collectives", "ncclcalls", "findings")


def run(args):
    result = CliRunner().invoke(frtrace, list(map(str, args)))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture
def job(tmp_path):
    """A 4-rank NCCL hang: rank 3 never issues all_reduce #4 of group 0."""
    return write_job(tmp_path / "dumps", nccl_hang_dumps())


@pytest.fixture
def db_path(job, tmp_path):
    path = tmp_path / "out.sqlite"
    result = run([job, "-o", path])
    assert result.exit_code == 1, result.output  # faults found, file still written
    return path


def query(path, sql, *params):
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, params).fetchall()


def test_tables_hold_the_database_rows(job, db_path):
    db = build_database(analyze([job]).matches)
    for table in ("groups", "memberships", "tracebacks", "collectives", "ncclcalls"):
        assert query(db_path, f"SELECT count(*) FROM {table}") == [(len(getattr(db, table)),)]
    assert query(db_path, "SELECT count(*) FROM frames") == [(sum(len(tb.frames) for tb in db.tracebacks),)]
    joined = query(db_path, """
        SELECT count(*) FROM ncclcalls n
        JOIN collectives c ON c.id = n.collective_id
        JOIN groups g ON g.id = n.group_id AND g.id = c.group_id
        JOIN ranks r ON r.rank = n.global_rank""")
    assert joined == [(len(db.ncclcalls),)]
    assert query(db_path, "PRAGMA foreign_key_check") == []
    assert query(db_path, "PRAGMA integrity_check") == [("ok",)]


def test_rows_carry_the_field_values(job, db_path):
    db = build_database(analyze([job]).matches)
    call = db.ncclcalls[5]
    row = query(db_path, "SELECT collective_id, global_rank, profiling_name, state, time_created_ns, "
                         "time_completed_ns, traceback_id FROM ncclcalls WHERE id = ?", call.id)
    assert row == [(call.collective_id, call.global_rank, call.profiling_name, call.state, call.time_created_ns,
                    call.time_completed_ns, call.traceback_id)]
    group = db.groups[0]
    assert query(db_path, "SELECT name, desc, ranks, size FROM groups WHERE id = 0") == [
        (group.name, group.desc, json.dumps(list(group.ranks), separators=(",", ":")), group.size)]


def test_which_ranks_never_issued_collective_4_of_group_0(db_path):
    from_json = query(db_path, """
        SELECT value FROM collectives c, json_each(c.not_issued_ranks)
        WHERE c.kind = 'collective' AND c.group_id = 0 AND c.collective_seq_id = 4""")
    assert from_json == [(3,)]
    by_join = query(db_path, """
        SELECT m.global_rank FROM memberships m
        WHERE m.group_id = 0 AND NOT EXISTS (
            SELECT 1 FROM ncclcalls n JOIN collectives c ON c.id = n.collective_id
            WHERE c.kind = 'collective' AND c.group_id = 0 AND c.collective_seq_id = 4
              AND n.global_rank = m.global_rank)""")
    assert by_join == [(3,)]


def test_json_columns_work_with_json_extract(db_path):
    rows = query(db_path, """
        SELECT DISTINCT json_extract(input_sizes, '$[0][0]'), json_extract(input_dtypes, '$[0]')
        FROM ncclcalls WHERE op = 'all_reduce'""")
    assert rows == [(16, "Float")]
    innermost = query(db_path, "SELECT DISTINCT name FROM frames WHERE depth = 0")
    assert innermost == [("all_reduce",)]
    frames = query(db_path, "SELECT frame_count, json_extract(frames, '$[1].filename') FROM tracebacks")
    assert frames == [(2, "/workspace/job/train.py")]


def test_findings_and_meta(db_path):
    finding = query(db_path, """
        SELECT f.kind, f.severity, f.root_cause, f.suspect_ranks, c.collective_seq_id, g.name
        FROM findings f JOIN collectives c ON c.id = f.collective_id JOIN groups g ON g.id = f.group_id
        WHERE f.severity = 'error'""")
    assert finding == [("not_issued", "error", 1, "[3]", 4, "0")]
    evidence = query(db_path, "SELECT json_extract(evidence, '$.not_issued_ranks') FROM findings WHERE kind = 'not_issued'")
    assert evidence == [("[3]",)]
    meta = dict(query(db_path, "SELECT key, value FROM meta"))
    assert meta["schema"] == "frtrace.sqlite/1"
    assert meta["status"] == "faults" and json.loads(meta["suspect_ranks"]) == [3]
    assert meta["frtrace_version"]


def test_ranks_table_describes_every_rank(job, tmp_path):
    (job / "rank_2").unlink()
    path = tmp_path / "missing.db"
    run([job, "-o", path])
    rows = query(path, "SELECT rank, has_dump, encoding, backend, entry_count, first_record_id, last_record_id, "
                       "wrapped, problem FROM ranks ORDER BY rank")
    assert rows == [
        (0, 1, "pickle", "nccl", 6, 0, 5, 0, None),
        (1, 1, "pickle", "nccl", 6, 0, 5, 0, None),
        (2, 0, None, None, None, None, None, None, "no dump file"),
        (3, 1, "pickle", "nccl", 3, 0, 2, 0, None),
    ]
    first, last = query(path, "SELECT first_time_created_ns, last_time_created_ns FROM ranks WHERE rank = 3")[0]
    assert 0 < first < last
    assert query(path, "PRAGMA foreign_key_check") == []


def test_same_dumps_give_the_same_rows(job, tmp_path):
    paths = [tmp_path / "a.sqlite", tmp_path / "b.sqlite3"]
    for path in paths:
        run([job, "-o", path])

    def everything(path):
        return {t: query(path, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}

    assert everything(paths[0]) == everything(paths[1])


@pytest.mark.parametrize("name", ["out.sqlite", "out.sqlite3", "out.db", "OUT.DB"])
def test_sqlite_suffixes_write_sqlite(job, tmp_path, name):
    path = tmp_path / name
    run([job, "-o", path])
    assert path.read_bytes()[:16] == b"SQLite format 3\x00"


def test_pkl_stays_a_pickle(job, tmp_path):
    path = tmp_path / "db.pkl"
    run([job, "-o", path])
    types, db = pickle.loads(path.read_bytes())
    assert "ncclcalls" in types and len(db.ncclcalls) == 19


def test_unknown_suffix_names_the_accepted_ones(job, tmp_path):
    result = run([job, "-o", tmp_path / "out.csv"])
    assert result.exit_code == 2
    assert ".pkl" in result.output and ".sqlite" in result.output and ".db" in result.output
    assert not (tmp_path / "out.csv").exists()


def test_existing_file_needs_force(job, db_path):
    before = db_path.read_bytes()
    result = run([job, "-o", db_path])
    assert result.exit_code == 2 and "already exists" in result.output and "--force" in result.output
    assert db_path.read_bytes() == before
    db_path.write_bytes(b"not a database")
    result = run([job, "-o", db_path, "--force"])
    assert result.exit_code == 1
    assert query(db_path, "SELECT count(*) FROM ncclcalls") == [(19,)]


def test_never_overwrites_a_dump_even_with_force(tmp_path):
    directory = tmp_path / "dumps"
    directory.mkdir()
    for rank, data in nccl_hang_dumps().items():
        write_json(directory / f"rank_{rank}.pkl", data)
    before = (directory / "rank_0.pkl").read_bytes()
    result = run([directory, "-o", directory / "rank_0.pkl", "--force"])
    assert result.exit_code == 2 and "refusing to overwrite an input dump file" in result.output
    assert (directory / "rank_0.pkl").read_bytes() == before


def test_a_failed_write_leaves_nothing_behind(job, tmp_path, monkeypatch):
    analysis = analyze([job])
    diagnosis = diagnose(analysis)

    def broken(path_tmp, analysis, diagnosis):
        sqlite3.connect(path_tmp).close()
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(outputs, "write_sqlite", broken)
    with pytest.raises(OutputError, match="disk I/O error"):
        write_output(tmp_path / "out.sqlite", "database", analysis, diagnosis)
    assert [p.name for p in tmp_path.iterdir()] == ["dumps"]


def test_ncclcalls_columns_follow_the_named_tuple(db_path):
    from frtrace.model import NCCLCall

    columns = tuple(row[1] for row in query(db_path, "PRAGMA table_info(ncclcalls)"))
    assert columns == NCCLCall._fields
