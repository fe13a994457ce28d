"""The costliest rules in forked children (diagnosis/side_by_side.py) give the diagnosis
that running every rule in this process gives, fault by fault, and a child that cannot
run or answer costs only time."""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import pytest
from helpers import analyse_dicts, forks_recorded, forks_refused, unreaped_children

import frtrace.diagnosis as diagnosis_package
import frtrace.diagnosis.linking as linking
import frtrace.diagnosis.side_by_side as side_by_side
import frtrace.load.forked as forked
from frtrace.diagnosis import COSTLY_FIRST, diagnose
from frtrace.diagnosis.facts import Facts
from frtrace.report.render import render_json, render_text
from frtrace.testing.synth import Fault, generate

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")


class Started(list):
    questions: list

FAULTS = [
    ("hang", "tp"), ("skip_op", "tp"), ("extra_op", "dp"), ("size_mismatch", "tp"), ("p2p_unmatched", "pp"),
    ("straggler", "tp"), ("stuck", "tp"), ("missing_dump_hang", "dp"), ("op_mismatch", "dp"),
]


def _job(kind: str, group: str, seed: int):
    job = generate(32, 2, 4, steps=4, fault=Fault(kind, rank=5, group=group, step=2), timing=True, seed=seed)
    analysis, _ = analyse_dicts(dict(job.dumps), render=False)
    return analysis


@pytest.fixture
def forked_rules(monkeypatch):
    """Fork at any size, share out any number of went-past questions, and count the
    rules that went to a child (`started`) and the questions each child answered
    (`started.questions`)."""
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    monkeypatch.setattr(side_by_side, "QUESTIONS_PER_RUN", 1)
    started = Started()
    started.questions = []
    real_start_each = side_by_side.Forked.start_each

    def start_each(function, shares):
        if getattr(function, "func", None) is side_by_side._run_on:  # the rules
            # the two longest rules are given their processes (a partial of the rule)
            started.extend(getattr(work, "func", work) for work in shares)
        else:  # the went-past questions' runs
            started.questions.extend(len(share) for share in shares)
        return real_start_each(function, shares)

    monkeypatch.setattr(side_by_side.Forked, "start_each", start_each)
    return started


@pytest.mark.parametrize("kind,group", FAULTS)
def test_rules_in_children_give_the_same_report(kind, group, forked_rules):
    analysis = _job(kind, group, seed=len(kind))
    here = diagnose(analysis, processes=1)
    assert forked_rules == []
    apart = diagnose(analysis, processes=len(COSTLY_FIRST) + 1)
    assert forked_rules == list(COSTLY_FIRST)
    time.sleep(0.1)
    assert unreaped_children() == []  # each child reaped, also those whose results came before they exited
    assert render_json(analysis, apart) == render_json(analysis, here)
    assert render_text(analysis, apart) == render_text(analysis, here)
    assert (apart.status, apart.suspect_ranks) != ("healthy", ()) or kind == "straggler"


def test_two_processes_fork_one_child_for_the_costliest_rule(forked_rules):
    analysis = _job("hang", "tp", seed=1)
    assert render_json(analysis, diagnose(analysis, processes=2)) == render_json(analysis, diagnose(analysis))
    assert forked_rules == [COSTLY_FIRST[0]]


def test_a_small_job_forks_nothing(monkeypatch):
    started = forks_recorded(monkeypatch)
    analysis = _job("hang", "tp", seed=1)
    assert sum(len(d.entries) for d in analysis.device_dumps) < side_by_side.FORK_FROM_ENTRIES
    diagnose(analysis, processes=8)
    assert started == []


def test_no_fork_runs_every_rule_here(monkeypatch):
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    forks_refused(monkeypatch)
    analysis = _job("skip_op", "tp", seed=2)
    assert render_json(analysis, diagnose(analysis, processes=8)) == render_json(analysis, diagnose(analysis))


def test_a_child_that_dies_or_sends_nothing_has_its_rule_run_here(monkeypatch, forked_rules):
    real_collect = side_by_side.Forked.collect

    def killed(self, wait=True):  # say by the OOM killer: reaped, no result
        real_collect(self, wait)
        return None, -9

    monkeypatch.setattr(side_by_side.Forked, "collect", killed)
    analysis = _job("p2p_unmatched", "pp", seed=3)
    apart = diagnose(analysis, processes=8)
    assert forked_rules == list(COSTLY_FIRST)
    assert render_json(analysis, apart) == render_json(analysis, diagnose(analysis))
    assert apart.suspect_ranks


def test_a_result_that_does_not_read_back_has_its_rule_run_here(monkeypatch, forked_rules):
    real_collect = side_by_side.Forked.collect

    def unreadable(self, wait=True):
        real_collect(self, wait)
        raise pickle.UnpicklingError("unexpected posix.system in a child's result")

    monkeypatch.setattr(side_by_side.Forked, "collect", unreadable)
    analysis = _job("size_mismatch", "tp", seed=4)
    assert render_json(analysis, diagnose(analysis, processes=3)) == render_json(analysis, diagnose(analysis))


@pytest.mark.parametrize("kind,group", [("hang", "tp"), ("skip_op", "tp"), ("p2p_unmatched", "pp"), ("stuck", "tp")])
def test_went_past_questions_answered_in_children_link_as_here(kind, group, forked_rules):
    analysis = _job(kind, group, seed=11)
    here = diagnose(analysis)
    apart = diagnose(analysis, processes=3)
    assert len(forked_rules.questions) == 2  # three runs: one here, two in children
    assert render_json(analysis, apart) == render_json(analysis, here)
    assert [(f.rule, f.caused_by is None, f.went_past) for f in apart.findings] == \
        [(f.rule, f.caused_by is None, f.went_past) for f in here.findings]


@pytest.mark.parametrize("kind,group", [("skip_op", "tp"), ("skip_op", "pp"), ("p2p_unmatched", "pp")])
def test_each_went_past_question_is_answered_alone_as_among_the_others(kind, group, forked_rules, monkeypatch):
    analysis = _job(kind, group, seed=11)
    asked = []
    real = linking._ranks_gone_past

    def spy(blocking, candidates, holders, went_past):
        return real(blocking, candidates, holders, lambda questions: (asked.extend(questions), went_past(questions))[1])

    monkeypatch.setattr(linking, "_ranks_gone_past", spy)
    diagnose(analysis)
    assert len(asked) >= 2
    facts = Facts.of(analysis)
    for questions in (asked, asked[::-1]):  # each answer at both ends: here, and in a child
        here = diagnosis_package._went_past_judge(facts, 1)(questions)
        apart = diagnosis_package._went_past_judge(facts, len(questions))(questions)
        assert apart == here
    assert any(here)  # the rank that skipped went past its op
    assert len(forked_rules.questions) == 2 * (len(asked) - 1)


def test_below_four_processes_nothing_forks(monkeypatch):
    """With two or three processes a child's copied pages cost more memory than its work
    saves time (forked.FORK_FROM_PROCESSES)."""
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(side_by_side, "QUESTIONS_PER_RUN", 1)
    started = forks_recorded(monkeypatch)
    analysis = _job("skip_op", "tp", seed=11)
    for processes in (2, 3):
        assert render_json(analysis, diagnose(analysis, processes=processes)) == render_json(analysis, diagnose(analysis))
    assert started == []


@pytest.fixture
def shares(monkeypatch):
    """Fork at 2 processes and up, and list each share of work given to a child."""
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    given: list = []
    real_start_each = side_by_side.Forked.start_each

    def start_each(function, parts):
        given.extend(parts)
        return real_start_each(function, parts)

    monkeypatch.setattr(side_by_side.Forked, "start_each", start_each)
    return given


@pytest.mark.parametrize("seed", [1, 2])
def test_the_stragglers_sampling_shared_out_finds_the_same_straggler(seed, shares):
    """The costliest rule samples its groups in shares, each other than the first in a
    forked child, and merges what they found: the same finding as sampling them here."""
    from frtrace.diagnosis import stragglers

    facts = Facts.of(_job("straggler", "tp", seed=seed))
    here = stragglers.late_arrivals(facts)
    assert here and here[0].suspect_ranks == (5,)
    for processes in (2, 3, 7):
        shares.clear()
        apart = stragglers.late_arrivals(facts, processes)
        assert len(shares) == processes - 1  # one share here, each other in a child
        assert [dataclasses.astuple(f) for f in apart] == [dataclasses.astuple(f) for f in here]
    typical_here = stragglers._typical_lateness(stragglers._samples(facts, 1))
    assert stragglers._typical_lateness(stragglers._samples(facts, 5)) == typical_here


def test_view_shares_hold_every_group_once_in_order():
    views = Facts.of(_job("hang", "tp", seed=1)).device.views
    for parts in (1, 2, 3, 8, len(views), len(views) + 5):
        shares = side_by_side.view_shares(views, parts)
        assert [view for share in shares for view in share] == list(views)
        assert 1 <= len(shares) <= min(parts, len(views))


def _a2a_mismatch_job():
    """A healthy job whose rank 5 says, in one MoE all_to_all of its DP group, that it
    received more than its peers sent it."""
    job = generate(32, 2, 4, steps=4, timing=True, seed=5)
    dumps = dict(job.dumps)
    exchanges = [e for e in dumps[5]["entries"] if e["profiling_name"].endswith("all_to_all_single")]
    exchanges[-2]["output_sizes"][0][0] += 7
    analysis, _ = analyse_dicts(dumps, render=False)
    return analysis


def test_the_all_to_all_sizes_shared_out_find_the_same_mismatch(shares):
    """The second costliest rule judges its groups in shares too: the same findings."""
    from frtrace.diagnosis import all_to_all

    facts = Facts.of(_a2a_mismatch_job())
    here = all_to_all.exchange_mismatches(facts)
    assert [f.rule for f in here] == ["all_to_all.totals"] and 5 in here[0].ranks
    assert shares == []
    for processes in (2, 3, 8):
        shares.clear()
        apart = all_to_all.exchange_mismatches(facts, processes)
        assert len(shares) == min(processes, 8) - 1  # eight DP groups hold all_to_alls
        assert [dataclasses.astuple(f) for f in apart] == [dataclasses.astuple(f) for f in here]


@pytest.mark.parametrize("processes,each", [(16, 5), (8, 2), (4, 1)])
def test_the_two_longest_rules_share_the_processes_left(processes, each, monkeypatch):
    """Sixteen processes: seven rule children and this process leave eight, shared by the
    stragglers' sampling and the all_to_all sizes (five each, their own child included)."""
    from frtrace.diagnosis.all_to_all import exchange_mismatches
    from frtrace.diagnosis.stragglers import late_arrivals

    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    given = {}

    def start_each(function, works):
        given.update((getattr(work, "func", work), getattr(work, "keywords", {}).get("processes")) for work in works)
        return [None] * len(works)  # run here

    monkeypatch.setattr(side_by_side.Forked, "start_each", start_each)
    facts = Facts.of(_job("hang", "tp", seed=1))
    side_by_side.RuleRuns.start(facts, COSTLY_FIRST, processes, spread=(late_arrivals, exchange_mismatches))
    assert list(given) == list(COSTLY_FIRST[:processes - 1])
    assert given[late_arrivals] == each and given[exchange_mismatches] == each
    assert all(count is None for rule, count in given.items() if rule not in (late_arrivals, exchange_mismatches))


def test_the_callers_work_runs_once_while_the_children_work(forked_rules):
    """`meanwhile` runs once, after the rule children are started and before their findings
    are read; the findings are those of a diagnosis without it."""
    analysis = _job("hang", "tp", seed=1)
    calls = []

    def meanwhile():
        calls.append(len(forked_rules))

    apart = diagnose(analysis, processes=len(COSTLY_FIRST) + 1, meanwhile=meanwhile)
    assert calls == [len(COSTLY_FIRST)]
    assert render_json(analysis, apart) == render_json(analysis, diagnose(analysis))


def test_the_callers_work_waits_for_no_child_where_none_is_started(monkeypatch):
    """Without children there is nothing to wait for: `meanwhile` is not called (the
    caller does its work when it needs it), whether none was asked for or none could fork."""
    monkeypatch.setattr(side_by_side, "FORK_FROM_ENTRIES", 0)
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    forks_refused(monkeypatch)
    analysis = _job("skip_op", "tp", seed=2)
    calls = []
    diagnose(analysis, processes=1, meanwhile=lambda: calls.append(1))
    diagnose(analysis, processes=8, meanwhile=lambda: calls.append(1))
    assert calls == []


def test_the_callers_work_runs_before_any_childs_findings_are_read(forked_rules, monkeypatch):
    """The order that makes `meanwhile` free: this process's own rules, then the caller's
    work, then the children's findings."""
    analysis = _job("p2p_unmatched", "pp", seed=3)
    events = []
    real_findings = side_by_side.RuleRuns.findings

    def findings(self, rule):
        events.append(("child" if rule in self.started else "here", rule.__name__))
        return real_findings(self, rule)

    monkeypatch.setattr(side_by_side.RuleRuns, "findings", findings)
    diagnose(analysis, processes=len(COSTLY_FIRST) + 1, meanwhile=lambda: events.append(("meanwhile", "")))
    first_child = next(i for i, (where, _) in enumerate(events) if where == "child")
    assert events.index(("meanwhile", "")) == first_child - 1
    assert all(where == "here" for where, _ in events[:first_child - 1])
