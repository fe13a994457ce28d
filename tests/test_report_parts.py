"""The report's parts that depend on the analysis alone (report/render.py: ReportParts):
readied while the diagnosis waits for its forked rules, read by every output of one run,
and never changed by one of them."""

from __future__ import annotations

import json
import os

import pytest
from helpers import analyse_dicts, dump, entry, write_job

import frtrace.diagnosis.side_by_side as side_by_side
import frtrace.load.forked as forked
import frtrace.report.rank_view as rank_view_module
import frtrace.report.render as render
from frtrace import api
from frtrace.export.outputs import write_output
from frtrace.logs.collect import read_logs
from frtrace.report.logs_report import render_with_logs
from frtrace.testing.joblogs import job_logs, write_job_logs
from frtrace.testing.synth import Fault, generate


def _analysis(kind: str = "hang", group: str = "tp"):
    job = generate(32, 2, 4, steps=4, fault=Fault(kind, rank=5, group=group, step=2), timing=True, seed=1)
    analysis, _ = analyse_dicts(dict(job.dumps), render=False)
    return analysis


def _every_output(diagnosis: api.Diagnosis) -> list[str]:
    return [diagnosis.to_json(), diagnosis.to_text(), diagnosis.to_text(verbose=True), diagnosis.to_markdown(),
            diagnosis.ranks("text"), diagnosis.ranks("json"), diagnosis.ranks("markdown")]


def _refuse(*_args, **_kwargs):
    raise AssertionError("worked out again after the diagnosis readied it")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
@pytest.mark.parametrize("kind,group", [("hang", "tp"), ("p2p_unmatched", "pp"), ("size_mismatch", "tp")])
def test_parts_readied_while_the_rules_ran_in_children_give_the_same_reports(kind, group, monkeypatch):
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    analysis = _analysis(kind, group)
    here = _every_output(api.diagnose(analysis, processes=1))
    apart = api.diagnose(analysis, processes=8)
    # Every part was worked out during the diagnosis: rendering works none out again.
    for module, name in ((render, "_inputs"), (render, "_match_counts"), (render, "rank_standings"),
                         (rank_view_module, "rank_standings")):
        monkeypatch.setattr(module, name, _refuse)
    assert _every_output(apart) == here
    assert apart.suspect_ranks == (5,) or kind == "p2p_unmatched"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
def test_the_html_report_reads_the_parts_the_diagnosis_readied(tmp_path, monkeypatch):
    """`--html` beside the report: the page is the one made without them, and works out
    no part again."""
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    analysis = _analysis()
    write_output(tmp_path / "alone.html", "html", analysis, api.diagnose(analysis).outcome)
    apart = api.diagnose(analysis, processes=8)
    for module, name in ((render, "_inputs"), (render, "_match_counts"), (render, "rank_standings"),
                         (rank_view_module, "rank_standings")):
        monkeypatch.setattr(module, name, _refuse)
    write_output(tmp_path / "shared.html", "html", analysis, apart.outcome, parts=apart.parts)
    assert (tmp_path / "shared.html").read_bytes() == (tmp_path / "alone.html").read_bytes()


def test_one_diagnosis_rendered_twice_and_with_logs_says_the_same_each_time(tmp_path):
    """The JSON report with logs adds the logs to its `inputs`: a copy, not the parts
    every later output reads."""
    dumps = {rank: dump([entry(s) for s in (1, 2, 3)] + [entry(4, state="started")], ranks=range(4))
             for rank in range(3)}
    analysis = api.analyze(write_job(tmp_path / "dumps", dumps), workers=1)
    diagnosis = api.diagnose(analysis)
    first = _every_output(diagnosis)
    evidence = read_logs([write_job_logs(job_logs(world=4, era="2.6", fault="crash", culprits=(3,), seq=4),
                                         tmp_path / "logs")], world_size=4)
    with_logs = json.loads(render_with_logs("json", analysis, diagnosis.outcome, evidence, parts=diagnosis.parts))
    assert "logs" in with_logs["inputs"]
    assert _every_output(diagnosis) == first
    assert "logs" not in json.loads(diagnosis.to_json())["inputs"]
    assert json.loads(first[0])["inputs"] == {key: value for key, value in with_logs["inputs"].items() if key != "logs"}


def test_the_dict_a_caller_is_given_is_its_own(tmp_path):
    """`Diagnosis.to_dict()` is the caller's to change: the reports after it stay the same."""
    analysis = _analysis()
    diagnosis = api.diagnose(analysis)
    before = diagnosis.to_json()
    report = diagnosis.to_dict()
    report["inputs"]["ranks_found"].clear()
    report["matched"]["collectives"] = -1
    assert diagnosis.to_json() == before


def _here_only(work, pid):
    """`work`, refused in the process `pid` (this one), allowed in its forked children."""
    def guarded(*args, **kwargs):
        if os.getpid() == pid:
            raise AssertionError("worked out in the main process")
        return work(*args, **kwargs)
    return guarded


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
def test_with_processes_to_spare_the_parts_are_worked_out_in_a_child_of_their_own(monkeypatch):
    """The main process sets the pace of a many-core run once the files are read: with
    processes to spare it works out none of the parts itself, and the reports are the
    ones worked out in one process."""
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    analysis = _analysis()
    here = _every_output(api.diagnose(analysis, processes=1))
    for module, name in ((render, "_inputs"), (render, "_match_counts"), (render, "rank_standings")):
        monkeypatch.setattr(module, name, _here_only(getattr(module, name), os.getpid()))
    apart = api.diagnose(analysis, processes=8)
    assert _every_output(apart) == here


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
def test_a_child_that_fails_to_work_out_the_parts_costs_time_not_the_report(monkeypatch):
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    analysis = _analysis("size_mismatch")
    here = _every_output(api.diagnose(analysis, processes=1))

    def dies(_analysis):
        os._exit(3)
    monkeypatch.setattr(render, "_parts_of", dies)
    assert _every_output(api.diagnose(analysis, processes=8)) == here


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
def test_parts_never_read_leave_no_child_behind(monkeypatch):
    """A caller that wants the verdict alone never reads the parts: once the diagnosis is
    dropped, their child is reaped and its file closed."""
    import gc

    from helpers import unreaped_children
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    analysis = _analysis()
    open_files = len(os.listdir("/proc/self/fd"))
    diagnosis = api.diagnose(analysis, processes=8)
    child = diagnosis.parts._apart
    assert child is not None and diagnosis.suspect_ranks == (5,)
    pid = child.pid
    del diagnosis, child
    gc.collect()
    with pytest.raises(ChildProcessError):  # waited for already
        os.waitpid(pid, os.WNOHANG)
    assert unreaped_children() == []
    assert len(os.listdir("/proc/self/fd")) == open_files
