import json
import pickle

import pytest
from click.testing import CliRunner
from helpers import dump, entry, write_job

from frtrace.cli.analyse import frtrace


def run(args, **kwargs):
    result = CliRunner().invoke(frtrace, list(map(str, args)), **kwargs)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def hang_job(tmp_path, culprit=3, world=4):
    """Every rank does all_reduce 1-3; all but `culprit` enqueue #4 and wait in it."""
    dumps = {}
    for rank in range(world):
        entries = [entry(seq) for seq in (1, 2, 3)]
        if rank != culprit:
            entries.append(entry(4, state="started"))
        dumps[rank] = dump(entries, ranks=range(world))
    return write_job(tmp_path / "dumps", dumps)


def healthy_job(tmp_path, world=4):
    return write_job(tmp_path / "dumps", {r: dump([entry(s) for s in (1, 2, 3)], ranks=range(world)) for r in range(world)})


def test_a_hang_names_the_culprit_and_exits_1(tmp_path):
    result = run([hang_job(tmp_path)])
    assert result.exit_code == 1
    first = result.output.splitlines()[0]
    assert first == "FAULT: rank 3 never issued all_reduce #4 in group 0 (default_pg); ranks 0-2 are waiting in it"


def test_json_report_follows_the_contract(tmp_path):
    result = run(["-d", hang_job(tmp_path), "--format", "json"])
    report = json.loads(result.output)
    assert result.exit_code == 1
    assert report["schema"] == "frtrace.report/1"
    assert report["status"] == "faults" and report["suspect_ranks"] == [3]
    assert report["inputs"]["ranks_found"] == [0, 1, 2, 3] and report["inputs"]["ranks_missing"] == []
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert {k: finding[k] for k in ("kind", "pg_name", "pg_desc", "op", "collective_seq_id", "suspect_ranks")} == {
        "kind": "not_issued", "pg_name": "0", "pg_desc": "default_pg", "op": "all_reduce",
        "collective_seq_id": 4, "suspect_ranks": [3],
    }


def test_healthy_exits_0_and_exit_zero_overrides_faults(tmp_path):
    assert run([healthy_job(tmp_path)]).exit_code == 0
    assert run([hang_job(tmp_path), "--exit-zero"]).exit_code == 0


def test_missing_dump_without_a_hang_is_inconclusive(tmp_path):
    directory = healthy_job(tmp_path)
    (directory / "rank_2").unlink()
    result = run([directory, "--format", "json"])
    report = json.loads(result.output)
    assert result.exit_code == 3 and report["status"] == "inconclusive"
    assert report["inputs"]["ranks_missing"] == [2] and report["suspect_ranks"] == []


def test_just_print_entries_shows_only_the_selected_rank_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(hang_job(tmp_path))
    result = run(["-j", "--selected-ranks", "0", "1"])
    header = result.output.splitlines()[0]
    assert result.exit_code == 0
    assert "rank 0" in header and "rank 1" in header and "rank 2" not in header and "rank 3" not in header
    assert sum(line.startswith("0 (default_pg)") for line in result.output.splitlines()) == 4


def test_just_print_aligns_rows_by_sequence_not_position(tmp_path):
    # rank 1's buffer wrapped: it holds only #3-#4 while rank 0 holds #1-#4.
    dumps = {
        0: dump([entry(s) for s in (1, 2, 3, 4)], ranks=[0, 1]),
        1: dump([entry(s, record_id=s + 10) for s in (3, 4)], ranks=[0, 1]),
    }
    directory = write_job(tmp_path / "d", dumps)
    lines = run(["-j", directory]).output.splitlines()
    row3 = next(line for line in lines if "#3" in line)
    assert row3.count("all_reduce") == 2
    row1 = next(line for line in lines if "#1" in line)
    assert "before window" in row1


def test_output_pickle_has_joining_tables(tmp_path):
    out = tmp_path / "db.pkl"
    result = run(["-d", hang_job(tmp_path), "-o", out])
    assert result.exit_code == 1 and out.exists()
    types, db = pickle.loads(out.read_bytes())
    assert set(types) == {"groups", "memberships", "tracebacks", "collectives", "ncclcalls"}
    group_ids = {g.id for g in db.groups}
    collective_ids = {c.id for c in db.collectives}
    assert {m.group_id for m in db.memberships} <= group_ids
    assert {c.group_id for c in db.collectives} <= group_ids
    assert all(call.collective_id in collective_ids for call in db.ncclcalls)
    assert {call.traceback_id for call in db.ncclcalls} <= {t.id for t in db.tracebacks}
    assert len(db.ncclcalls) == 15
    seq4 = next(c for c in db.collectives if c.collective_seq_id == 4)
    assert seq4.not_issued_ranks == (3,) and seq4.state == "partial"


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "db.pkl"
    out.write_bytes(b"old")
    directory = hang_job(tmp_path)
    result = run([directory, "-o", out])
    assert result.exit_code == 2 and "already exists" in result.output
    assert run([directory, "-o", out, "--force"]).exit_code == 1 and out.read_bytes() != b"old"


def test_output_never_overwrites_a_dump(tmp_path):
    directory = hang_job(tmp_path)
    before = (directory / "rank_0").read_bytes()
    result = run([directory, "-o", directory / "rank_0", "--force"])
    assert result.exit_code == 2 and "input dump" in result.output
    assert (directory / "rank_0").read_bytes() == before


def test_no_dumps_is_exit_2_with_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    result = run([tmp_path])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "no Flight Recorder dump files found" in result.output


def test_only_unreadable_dumps_is_exit_2_naming_the_file(tmp_path):
    (tmp_path / "rank_0").write_bytes(b"\x80\x02garbage")
    result = run([tmp_path])
    assert result.exit_code == 2 and "rank_0" in result.output and "Traceback" not in result.output


def test_one_unreadable_rank_is_named_and_the_rest_analysed(tmp_path):
    directory = healthy_job(tmp_path)
    (directory / "rank_1").write_bytes(b"\x80\x02truncat")
    result = run([directory, "--format", "json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 3
    assert report["inputs"]["ranks_missing"] == [1]
    assert report["inputs"]["unreadable_files"][0]["path"].endswith("rank_1")


def test_default_directory_comes_from_the_dump_env_variable(tmp_path, monkeypatch):
    directory = hang_job(tmp_path)
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(directory / "rank_"))
    result = run([])
    assert result.exit_code == 1 and "rank 3 never issued" in result.output


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_reports_do_not_depend_on_file_order_or_layout(tmp_path, fmt):
    first = run([hang_job(tmp_path / "a"), "--format", fmt]).output
    nested = tmp_path / "b" / "dumps"
    nested.mkdir(parents=True)
    for rank, sub in zip(range(4), ["x", "y", "x", "z"]):
        (nested / sub).mkdir(exist_ok=True)
        (nested / sub / f"rank_{rank}").write_bytes((tmp_path / "a" / "dumps" / f"rank_{rank}").read_bytes())
    second = run([nested, "--format", fmt]).output
    assert first.replace(str(tmp_path / "a" / "dumps"), "D") .count("\n") == second.count("\n")
    if fmt != "json":
        assert first == second
    else:
        a, b = json.loads(first), json.loads(second)
        a["inputs"].pop("skipped_files"), b["inputs"].pop("skipped_files")
        paths = a["inputs"].pop("dump_files"), b["inputs"].pop("dump_files")
        assert [[f["rank"] for f in files] for files in paths] == [[0, 1, 2, 3]] * 2
        assert a == b
