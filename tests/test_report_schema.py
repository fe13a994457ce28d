"""The JSON report for CI (issue 25 item 8): its JSON Schema ships in the package and holds
for real reports of every shape; the frtrace version, the time of the hang, each rank's
dump file and integer rank lists are in it; `--format ranks` prints the suspects alone."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from helpers import copy_fixture, run_cli, write_synth_job

from frtrace._version import __version__
from frtrace.load.loader import load_dumps
from frtrace.report.render import report_schema
from frtrace.testing.synth import Fault, generate
from frtrace.util import parse_rank_ranges

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extra: pip install '.[test]'")


def _validator():
    schema = report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _expand(folded: str) -> list:
    return sorted(r for span in parse_rank_ranges(folded, 1 << 20) for r in span) if folded else []


def _synth(tmp_path, **kwargs):
    return write_synth_job(tmp_path / "dumps", generate(32, tp=4, pp=2, steps=3, **kwargs))


def _junk_beside(directory):
    (directory / "rank_99.log").write_text("not a dump")
    (directory / "rank_31").write_bytes(b"\x80\x02garbage")
    return directory


SHAPES = {
    "gloo hang": lambda tmp: copy_fixture("hang_never_arrives", tmp / "dumps"),
    "gloo healthy": lambda tmp: copy_fixture("healthy_8rank_mesh", tmp / "dumps"),
    "gloo missing dump": lambda tmp: copy_fixture("missing_dump_hang", tmp / "dumps"),
    "gloo p2p, JSON dumps": lambda tmp: copy_fixture("p2p_unmatched_recv_json", tmp / "dumps"),
    "nccl cascade, timing": lambda tmp: _synth(tmp, timing=True, fault=Fault("hang", rank=5, group="tp", step=2)),
    "nccl only active": lambda tmp: _synth(tmp, timing=True, only_active=True, fault=Fault("hang", rank=5, step=2)),
    "nccl, no frames, unreadable file": lambda tmp: _junk_beside(_synth(tmp, with_frames=False,
                                                                        fault=Fault("size_mismatch", rank=3, step=1))),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_real_reports_of_every_shape_hold_to_the_shipped_schema(shape, tmp_path):
    directory = SHAPES[shape](tmp_path)
    validator = _validator()
    for extra in ([], ["--ranks"]):
        result = run_cli([directory, "--format", "json"] + extra)
        assert result.exit_code in (0, 1, 3), result.output
        report = json.loads(result.stdout)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(report)]
        assert not errors, errors[:5]
        assert report["frtrace_version"] == __version__
        for row in report["ranks"]:
            assert row["rank_list"] == _expand(row["ranks"]) and row["count"] == len(row["rank_list"])
    for group in report["inputs"]["groups"] if "inputs" in report else []:
        assert group["rank_list"] == _expand(group["ranks"])


def test_a_report_missing_a_field_or_of_a_wrong_type_is_refused(tmp_path):
    report = json.loads(run_cli([copy_fixture("hang_never_arrives", tmp_path / "d"), "--format", "json"]).stdout)
    validator = _validator()
    assert validator.is_valid(report)
    for broken in ({**report, "status": "fine"}, {k: v for k, v in report.items() if k != "summary"},
                   {**report, "suspect_ranks": ["2"]}, {**report, "newest_entry_utc": "yesterday"},
                   {k: v for k, v in report.items() if k != "inputs"}):
        assert not validator.is_valid(broken)


def test_the_time_of_the_hang_and_the_dump_of_each_rank(tmp_path):
    directory = _synth(tmp_path, timing=True, fault=Fault("hang", rank=5, group="tp", step=2))
    report = json.loads(run_cli([directory, "--format", "json"]).stdout)
    dumps = load_dumps([directory], workers=1).dumps
    newest = max(d.entries.value("time_created_ns", i) for d in dumps for i in range(len(d.entries)))
    stamp = datetime.fromtimestamp(newest // 10**9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    assert report["newest_entry_utc"] == f"{stamp}.{newest % 10**9 // 10**6:03d}Z"
    assert report["inputs"]["dump_files"] == [{"rank": d.rank, "path": d.path} for d in sorted(dumps, key=lambda d: d.rank)]
    assert [f["rank"] for f in report["inputs"]["dump_files"]] == list(range(32))


def test_format_ranks_prints_the_suspects_alone_on_one_line(tmp_path):
    hang = run_cli([copy_fixture("hang_never_arrives", tmp_path / "hang"), "--format", "ranks"])
    assert (hang.exit_code, hang.stdout) == (1, "2\n")
    several = _synth(tmp_path, fault=Fault("gpu_error", ranks=(3, 17), step=2), timing=True)
    result = run_cli([several, "--format", "ranks"])
    report = json.loads(run_cli([several, "--format", "json"]).stdout)
    assert result.exit_code == 1 and result.stdout == " ".join(map(str, report["suspect_ranks"])) + "\n"
    assert len(report["suspect_ranks"]) >= 2
    healthy = run_cli([copy_fixture("healthy_8rank_mesh", tmp_path / "ok"), "--format", "ranks"])
    assert (healthy.exit_code, healthy.stdout) == (0, "\n")
