"""The SQLite `rank_positions` table, and every SQL query the docs show (issue 17)."""

import re
import sqlite3
from pathlib import Path

import pytest
from helpers import nccl_hang_dumps, write_job, write_synth_job

from frtrace.diagnosis import diagnose
from frtrace.export.sqlite import write_sqlite
from frtrace.match.analysis import analyze
from frtrace.testing.synth import Fault, generate

README = Path(__file__).resolve().parent.parent / "docs" / "database.md"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hang_never_arrives"


def readme_queries() -> list:
    """Every ```sql block of the "Querying with SQL" section (docs/database.md)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Querying with SQL"):]
    end = section.find("\n## ", 3)  # the section runs to the next one, or to the page's end
    section = section if end < 0 else section[:end]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def export(directory, tmp_path, name="db.sqlite"):
    analysis = analyze([directory], workers=1)
    path = tmp_path / name
    write_sqlite(str(path), analysis, diagnose(analysis))
    return sqlite3.connect(path)


@pytest.fixture
def hung_db(tmp_path):
    """4 ranks; rank 3 never issues all_reduce #4 of group 0, ranks 0-2 wait in it."""
    return export(write_job(tmp_path / "dumps", nccl_hang_dumps()), tmp_path)


def test_the_readme_has_the_queries():
    queries = readme_queries()
    assert len(queries) >= 6
    assert any("rank_positions" in q for q in queries)


@pytest.mark.parametrize("source", ["example", "synth"])
def test_every_readme_query_runs(tmp_path, source):
    if source == "example":
        conn = export(EXAMPLE, tmp_path)
    else:
        job = generate(world_size=16, tp=4, pp=2, steps=3, timing=True, fault=Fault("hang", rank=5, group="tp", step=2))
        conn = export(write_synth_job(tmp_path / "synth", job), tmp_path)
    for sql in readme_queries():
        conn.execute(sql).fetchall()


def test_rank_positions_gives_the_op_a_hung_rank_is_blocked_in(hung_db):
    rows = hung_db.execute(
        "SELECT rank, pg_desc, blocked_op, blocked_collective_seq_id, blocked_p2p_seq_id, blocked_state, "
        "blocked_call_id FROM rank_positions WHERE blocked_here ORDER BY rank").fetchall()
    assert [r[:6] for r in rows] == [(r, "default_pg", "all_reduce", 4, None, "started") for r in (0, 1, 2)]
    # The call id joins: it is that rank's entry of all_reduce #4.
    for rank, *_, call_id in rows:
        assert hung_db.execute("SELECT global_rank, op, collective_seq_id FROM ncclcalls WHERE id = ?",
                               (call_id,)).fetchone() == (rank, "all_reduce", 4)


def test_rank_positions_of_the_rank_that_never_issued_it(hung_db):
    rows = hung_db.execute(
        "SELECT pg_desc, position, blocked_here, blocked_op, last_completed_op, last_completed_collective_seq_id, entries "
        "FROM rank_positions WHERE rank = 3 ORDER BY group_id").fetchall()
    assert rows == [("default_pg", "idle", 0, None, "all_reduce", 3, 3)]
    # Ranks 0 and 1 also finished their tp all_gather.
    tp = hung_db.execute("SELECT rank, position, last_completed_op FROM rank_positions WHERE pg_desc = 'tp' "
                         "ORDER BY rank").fetchall()
    assert tp == [(0, "idle", "all_gather"), (1, "idle", "all_gather")]


def test_the_readme_rank_query_answers_with_one_row_per_rank(hung_db):
    (where,) = [q for q in readme_queries() if "b.blocked_here" in q]
    rows = hung_db.execute(where).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert rows[0][1:4] == ("default_pg", "all_reduce", 4)
    assert rows[3][1:4] == (None, None, None) and rows[3][-1] == "default_pg all_reduce #3"


def test_queries_use_the_indexes(hung_db):
    plans = {sql: " ".join(str(row) for row in hung_db.execute("EXPLAIN QUERY PLAN " + sql))
             for sql in readme_queries()}
    for sql, plan in plans.items():
        # No query reads the whole ncclcalls table row by row.
        assert "SCAN n " not in plan + " " and "SCAN ncclcalls " not in plan + " ", (sql, plan)
