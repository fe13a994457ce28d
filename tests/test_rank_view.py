"""The per-rank view ("where is each rank?"), its folding, and its place in the reports."""

from __future__ import annotations

import json
import re

from helpers import analyse_dicts, fixture_dir, job, run_cli

from frtrace.diagnosis import diagnose
from frtrace.match.analysis import analyze
from frtrace.report.rank_view import BLOCKED, IDLE, NO_DUMP, rank_view
from frtrace.report.render import markdown_text, render_json, render_markdown, render_text
from frtrace.testing.synth import Fault, generate


def _row_of(view, rank):
    return next(row for row in view.rows if rank in row.ranks)


def test_gloo_hang_rank_2_is_not_in_the_op_its_peers_wait_in():
    analysis = analyze([fixture_dir("hang_never_arrives")])
    diagnosis = diagnose(analysis)
    view = rank_view(analysis, diagnosis.suspect_ranks)
    waiting = _row_of(view, 3)
    assert waiting.standing == BLOCKED
    assert (waiting.blocked_in.op, waiting.blocked_in.collective_seq_id, waiting.blocked_groups) == ("all_reduce", 4, ("0",))
    culprit = _row_of(view, 2)
    assert culprit.ranks == (2,) and culprit.suspect and view.rows[0] is culprit
    assert culprit.blocked_in is None or culprit.blocked_in.collective_seq_id != 4
    assert culprit.last_completed.collective_seq_id == 3
    assert [(c.desc, lag, names) for c, lag, names in culprit.behind] == [("default_pg", 1, ("0",))]
    # gloo retires a timed-out op too: the view says "retired", not "completed"
    assert view.completion_word == "retired"
    assert view.rank_count == 4


def test_nccl_job_folds_the_waiting_ranks_and_names_the_one_behind():
    analysis, diagnosis = analyse_dicts(job({0: ["all_reduce"] * 2, 1: ["all_reduce"] * 2, 2: ["all_reduce"],
                                             3: ["all_reduce"] * 2}), render=False)
    view = rank_view(analysis, diagnosis.suspect_ranks)
    assert [row.ranks for row in view.rows] == [(2,), (0, 1, 3)]
    late, waiting = view.rows
    assert late.standing == IDLE and late.blocked_in is None and late.behind[0][1] == 1
    assert waiting.standing == BLOCKED and waiting.blocked_in.state == "started"
    assert waiting.blocked_in.collective_seq_id == 2 and waiting.since_ns is not None
    assert late.last_completed.collective_seq_id == waiting.last_completed.collective_seq_id == 1
    text = render_text(analysis, diagnosis, width=None)
    section = text[text.index("Where each rank is"):]
    assert re.search(r"^\s+2 \*\s+1\s+nothing", section, re.M)
    assert re.search(r"^\s+0-1,3\s+3\s+all_reduce #2 in group 0 \(default_pg\)\s+started", section, re.M)


def test_ranks_without_a_dump_are_listed_as_such():
    analysis, diagnosis = analyse_dicts(job({0: ["all_reduce"] * 2, 1: ["all_reduce"] * 2}, world=4), render=False)
    view = rank_view(analysis, diagnosis.suspect_ranks)
    missing = _row_of(view, 2)
    assert missing.standing == NO_DUMP and missing.ranks == (2, 3)
    report = json.loads(render_json(analysis, diagnosis))
    assert {"ranks": "2-3", "standing": "no_dump"}.items() <= next(r for r in report["ranks"] if r["ranks"] == "2-3").items()


def test_a_thousand_ranks_fold_into_a_few_rows():
    synth = generate(1024, tp=8, pp=4, steps=2, fault=Fault("hang", rank=37, group="tp", step=1), timing=True,
                     lookahead=2)
    analysis, diagnosis = analyse_dicts({r: synth.dumps[r] for r in synth.dumps}, render=False)
    view = rank_view(analysis, diagnosis.suspect_ranks)
    assert len(view.rows) <= 8
    assert sorted(r for row in view.rows for r in row.ranks) == list(range(1024))
    assert view.rows[0].ranks == (37,) and view.rows[0].suspect
    # the waiting TP peers of rank 37 stand apart from the ranks stalled in DP
    assert _row_of(view, 36).blocked_in.pg_desc == "tp" and _row_of(view, 0).blocked_in.pg_desc == "dp"
    report = json.loads(render_json(analysis, diagnosis))
    assert len(report["ranks"]) == len(view.rows)
    assert len(json.dumps(report["ranks"])) < 20_000
    text = render_text(analysis, diagnosis, width=None)
    assert len(text[text.index("Where each rank is"):].splitlines()) < 20


def test_a_long_view_is_capped_in_the_report_with_a_note(monkeypatch):
    import frtrace.report.render as report

    analysis, diagnosis = analyse_dicts(job({0: ["all_reduce"] * 2, 1: ["all_reduce"] * 2, 2: ["all_reduce"],
                                             3: ["all_reduce"] * 2}), render=False)
    monkeypatch.setattr(report, "RANK_ROWS_IN_REPORT", 1)
    text = report.render_text(analysis, diagnosis)
    assert "... 1 more row (frtrace --ranks shows them all)" in text
    assert "0-1,3" not in text.split("Where each rank is")[1]


HOSTILE = "a|b<img src=x onerror=alert(1)>`c`\nd"


def _hostile_job():
    return job({0: ["all_reduce@" + HOSTILE] * 2, 1: ["all_reduce@" + HOSTILE] * 2, 2: ["all_reduce@" + HOSTILE]},
               groups={HOSTILE: ("desc|<b>x</b>", (0, 1, 2))})


def test_markdown_leads_with_the_verdict_and_escapes_dump_strings():
    analysis, diagnosis = analyse_dicts(_hostile_job(), render=False)
    assert HOSTILE in diagnosis.verdict
    markdown = render_markdown(analysis, diagnosis)
    assert markdown.splitlines()[0] == "### " + markdown_text(diagnosis.verdict)
    assert "<img" not in markdown and "<b>" not in markdown and "`" not in markdown.replace("\\`", "")
    assert "a\\|b&lt;img src=x onerror=alert(1)&gt;" in markdown
    # every table row keeps its columns: no unescaped | from the dumps
    for line in markdown.splitlines():
        if line.startswith("|"):
            header_cells = 7
            assert len(re.findall(r"(?<!\\)\|", line)) == header_cells + 1, line
    # call sites and the next step of the root finding
    assert "  - suspect call site: /workspace/job/train.py:42 in train_step" in markdown
    assert "next step: look at what rank(s) 2" in markdown


def test_ranks_flag_prints_only_the_view(tmp_path):
    from helpers import write_job

    directory = write_job(tmp_path / "dumps", job({0: ["all_reduce"] * 2, 1: ["all_reduce"] * 2, 2: ["all_reduce"],
                                                   3: ["all_reduce"] * 2}))
    result = run_cli([directory, "--ranks"])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("FAULT: rank 2 never issued")
    assert "Where each rank is" in result.stdout and "[error" not in result.stdout and "Read 4 dumps" not in result.stdout
    as_json = json.loads(run_cli([directory, "--ranks", "--format", "json"]).stdout)
    assert [row["ranks"] for row in as_json["ranks"]] == ["2", "0-1,3"]
    as_markdown = run_cli([directory, "--ranks", "--format", "markdown"]).stdout
    assert as_markdown.startswith("### FAULT:") and "| 0-1,3 | 3 |" in as_markdown
    refused = run_cli([directory, "--ranks", "-j"])
    assert refused.exit_code == 2


def test_next_step_points_at_the_suspect_call_site_only_where_the_report_shows_one():
    # Rank 2 never issued #2: with stacks, the report shows where it stood and the next
    # step points there; dumps without stacks show no call site, and the step must not
    # send the reader looking for one.
    steps = {0: ["all_reduce"] * 2, 1: ["all_reduce"] * 2, 2: ["all_reduce"]}
    without = job(steps)
    for dump in without.values():
        for entry in dump["entries"]:
            entry["frames"] = []
    for dumps, shown in ((job(steps), True), (without, False)):
        analysis, diagnosis = analyse_dicts(dumps)
        assert diagnosis.suspect_ranks == (2,)
        text = render_text(analysis, diagnosis, width=None)
        assert "look at what rank(s) 2 were doing instead" in text
        assert ("suspect call site:" in text) is shown
        assert ("the suspect call site above" in text) is shown


def test_a_suspect_never_shares_a_row_with_ranks_that_are_not():
    # Every rank stands in the same all_reduce, rank 1 with another size: folded by where
    # they stand alone, the view would print one row "0-3 *", four suspects to the eye.
    odd = ("all_reduce", {"sizes": ((17,),)})
    analysis, diagnosis = analyse_dicts(job({0: ["all_reduce"], 1: [odd], 2: ["all_reduce"], 3: ["all_reduce"]}),
                                        render=False)
    assert diagnosis.suspect_ranks == (1,)
    view = rank_view(analysis, diagnosis.suspect_ranks)
    assert [(row.ranks, row.suspect) for row in view.rows] == [((1,), True), ((0, 2, 3), False)]
    assert view.rows[0].standing == view.rows[1].standing == BLOCKED
