"""The command line with logs: `frtrace job.log`, a directory of logs, `--logs` beside
dumps; exit codes, report shapes, hosts, and dump reports left as they were."""

import gzip
import json

from click.testing import CliRunner
from helpers import dump, entry, write_job

from frtrace.cli.analyse import frtrace
from frtrace.testing.joblogs import job_logs, write_job_logs


def run(args, **kwargs):
    result = CliRunner().invoke(frtrace, list(map(str, args)), **kwargs)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def logs(tmp_path, name="logs", **kwargs):
    kwargs.setdefault("world", 8)
    return write_job_logs(job_logs(**kwargs), tmp_path / name)


def test_a_log_file_names_the_rank_and_its_host_and_exits_1(tmp_path):
    result = run([logs(tmp_path, fault="never_arrives", culprits=(5,)) / "job.log"])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("FAULT: rank 5 never reached all_reduce #1580 of group 0")
    assert "Suspect ranks: 5 (5 on node01)" in result.output
    assert "drain node node01" in result.output


def test_exit_codes_for_logs_alone(tmp_path):
    assert run([logs(tmp_path, name="stuck", fault="stuck", culprits=())]).exit_code == 3
    assert run([logs(tmp_path, name="healthy", fault="healthy", culprits=())]).exit_code == 0
    assert run([logs(tmp_path, name="crash", fault="crash", culprits=(2,)), "--exit-zero"]).exit_code == 0


def test_a_directory_of_per_rank_gzip_logs(tmp_path):
    directory = write_job_logs(job_logs(8, fault="crash", culprits=(6,), layout="per_rank"), tmp_path / "d",
                               gzip_files=True)
    result = run([directory])
    assert result.exit_code == 1 and "rank 6 ended with torch.OutOfMemoryError" in result.output


def test_json_report_of_logs(tmp_path):
    result = run(["--format", "json", logs(tmp_path, era="2.5", fault="op_mismatch", culprits=(3,)) / "job.log"])
    report = json.loads(result.output)
    assert report["schema"] == "frtrace.report/1" and report["status"] == "faults"
    assert report["suspect_ranks"] == [3] and report["suspects"] == [{"rank": 3, "host": "node01"}]
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert (finding["kind"], finding["rule"], finding["op"], finding["collective_seq_id"]) == (
        "op_mismatch", "logs.mismatch", "all_reduce", 1580)
    assert finding["evidence"]["suspect_hosts"] == {"3": "node01"}
    inputs = report["inputs"]["logs"]
    assert inputs["torch_versions"] == "2.5" and inputs["world_size"] == 8 and inputs["ranks_found"] == list(range(8))
    assert inputs["files"][0]["runs"] == 1 and inputs["hosts"]["3"] == "node01"
    assert report["ranks"][0] == {"ranks": "3", "count": 1, "state": "timed out", "in": "broadcast #1580 of group 0",
                                  "last_enqueued": 1580, "last_completed": 1579, "hosts": ["node01"], "suspect": True}


def test_markdown_ranks_and_html_of_logs(tmp_path):
    log = logs(tmp_path, fault="never_arrives", culprits=(1,)) / "job.log"
    markdown = run(["--format", "markdown", log]).output
    assert markdown.startswith("### FAULT: rank 1 never reached") and "| 1 \\* | 1 | told to dump |" in markdown
    ranks = run(["--ranks", log]).output
    assert "Where each rank is, by its log" in ranks and "Group 0" not in ranks
    page = tmp_path / "report.html"
    result = run(["--html", page, log])
    assert result.exit_code == 1 and "<!DOCTYPE html>" in page.read_text() and "never reached" in page.read_text()


def test_dump_only_outputs_are_refused_for_logs(tmp_path):
    log = logs(tmp_path, fault="stuck", culprits=()) / "job.log"
    for flag in (["-o", tmp_path / "db.pkl"], ["--timeline", tmp_path / "t.json"], ["-j"]):
        result = run(flag + [log])
        assert result.exit_code == 2 and "need" in result.output and "logs only" in result.output


def test_a_text_file_that_is_no_job_log_is_an_input_error(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("remember to buy milk\n")
    result = run([notes])
    assert result.exit_code == 2 and "no line of a distributed job" in result.output


def hang_dumps(tmp_path, world=4, without=3):
    dumps = {rank: dump([entry(s) for s in (1, 2, 3)] + [entry(4, state="started")], ranks=range(world))
             for rank in range(world) if rank != without}
    return write_job(tmp_path / "dumps", dumps)


def test_logs_stand_in_for_a_missing_dump(tmp_path):
    directory = hang_dumps(tmp_path)
    log_dir = logs(tmp_path, world=4, era="2.6", fault="crash", culprits=(3,), seq=4)
    result = run([directory, "--logs", log_dir])
    assert result.exit_code == 1
    first = " ".join(result.output.split("\nSuspect ranks")[0].split())  # the verdict, unwrapped
    assert first.startswith("FAULT: rank 3 left no usable dump") and "its log: rank 3 ended with torch.OutOfMemoryError" in first
    report = json.loads(run([directory, "--logs", log_dir, "--format", "json"]).output)
    assert report["suspects"] == [{"rank": 3, "host": "node01"}]
    assert report["inputs"]["logs"]["files"][0]["path"].endswith("job.log")
    stand_in = report["findings"][0]
    assert (stand_in["rule"], stand_in["suspect_ranks"], stand_in["evidence"]["stands_in_for_dump"]) == ("logs.crashed", [3], [3])


def test_dumps_that_look_healthy_beside_logs_of_a_hang_are_inconclusive(tmp_path):
    healthy = write_job(tmp_path / "dumps", {r: dump([entry(s) for s in (1, 2, 3)], ranks=range(4)) for r in range(4)})
    assert run([healthy]).exit_code == 0
    log_dir = logs(tmp_path, world=4, era="2.6", fault="never_arrives", culprits=(2,), seq=3)
    result = run([healthy, "--logs", log_dir, "--format", "json"])
    report = json.loads(result.output)
    assert result.exit_code == 3 and report["status"] == "inconclusive"
    conflicts = [f for f in report["findings"] if f["kind"] == "evidence_conflict"]
    assert conflicts and all(f["severity"] == "warning" for f in conflicts)


def test_a_dump_report_without_logs_is_unchanged(tmp_path):
    directory = hang_dumps(tmp_path)
    report = json.loads(run([directory, "--format", "json"]).output)
    assert "suspects" not in report and "logs" not in report["inputs"]
    assert "drain" not in run([directory]).output


def test_a_gzip_log_given_by_name(tmp_path):
    job = job_logs(8, era="2.4", fault="never_arrives", culprits=(4,))
    path = tmp_path / "job.log.gz"
    path.write_bytes(gzip.compress(job.files["job.log"]))
    result = run([path])
    assert result.exit_code == 1 and "Suspect ranks: 4" in result.output


def test_a_log_without_a_log_s_name_is_read_once_no_dump_is_found(tmp_path):
    job = job_logs(8, era="2.6", fault="never_arrives", culprits=(2,))
    path = tmp_path / "stderr"
    path.write_bytes(job.files["job.log"])
    result = run([path])
    assert result.exit_code == 1 and "Suspect ranks: 2" in result.output
