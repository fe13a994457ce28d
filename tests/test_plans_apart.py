"""Groups planned in forked children (matcher._plans_apart) give the matches that
matching every group in this process gives: collectives settled and judged, P2P pairs on
whole and wrapped rings, batched and any-source receives; and a child that cannot run or
answer costs only time."""

from __future__ import annotations

import os
import pickle

import pytest
from helpers import analyse_dicts, forks_recorded, forks_refused

import frtrace.load.forked as forked
import frtrace.match.matcher as matcher
from frtrace.load.layout import build_layout
from frtrace.match.matcher import match
from frtrace.testing.synth import Fault, generate

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")

JOBS = [
    dict(fault=Fault("hang", rank=5, group="tp", step=2)),
    dict(fault=Fault("size_mismatch", rank=6, group="tp", step=1)),
    dict(fault=Fault("op_mismatch", rank=3, group="dp", step=2)),
    dict(fault=Fault("p2p_unmatched", rank=9, group="pp", step=2), p2p="batched"),
    dict(fault=Fault("p2p_unmatched", rank=9, group="pp", step=2), p2p="mixed", buffer_size=60),
    dict(fault=Fault("skip_op", rank=2, group="tp", step=2), buffer_size=45, lookahead=2),
    dict(fault=Fault("missing_dump_hang", rank=4, group="dp", step=2)),
    dict(fault=Fault("hang", rank=5, group="dp", step=2), only_active=True),
    dict(fault=None, buffer_size=30),
]


def _dumps(spec: dict):
    job = generate(32, 2, 4, steps=4, timing=True, seed=7, **spec)
    analysis, _ = analyse_dicts(dict(job.dumps), render=False)
    return analysis.load.dumps


def _as_values(result) -> tuple:
    """Every field of every match, the entries each collective's calls read included."""
    collectives = [(m.group_id, m.seq, m.not_issued, m.out_of_window, m.no_dump, m.unfinished, m.disagreement,
                    m.completed_ranks, m.finished_unseen, tuple(m.calls), tuple(m.calls.values()))
                   for m in result.collectives]
    p2p = [(p.group_id, p.src, p.dst, p.ordinal, p.send, p.recv) for p in result.p2p]
    return collectives, p2p


@pytest.fixture
def planned_apart(monkeypatch):
    """Plan apart at any size, and count the children started."""
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    monkeypatch.setattr(matcher, "PLAN_ENTRIES_PER_CHILD", 1)
    started = []
    real_start_each = forked.Forked.start_each

    def start_each(function, shares):
        started.extend(len(views) for views in shares)
        return real_start_each(function, shares)

    monkeypatch.setattr(forked.Forked, "start_each", start_each)
    return started


@pytest.mark.parametrize("spec", JOBS, ids=lambda s: f"{s['fault'].kind if s['fault'] else 'healthy'}-"
                         + "-".join(f"{k}={v}" for k, v in s.items() if k != "fault"))
@pytest.mark.parametrize("processes", [2, 5])
def test_groups_planned_in_children_match_as_here(spec, processes, planned_apart):
    dumps = _dumps(spec)
    layout = build_layout(dumps, (), None)
    here = match(dumps, layout)
    assert planned_apart == []
    apart = match(dumps, layout, processes=processes)
    assert planned_apart and sum(planned_apart) <= len(apart.views)
    assert _as_values(apart) == _as_values(here)
    for result in (here, apart):  # the index made while building is the one made of the lists
        fresh = matcher.MatchIndex.of(result)
        assert result.index.collectives_of == fresh.collectives_of and result.index.p2p_of == fresh.p2p_of
        assert list(result.index.collectives_of) == list(fresh.collectives_of)
        assert all(result.index.at.get((m.group_id, m.seq)) is m for m in result.collectives)
    assert here.collectives and (here.p2p or spec["fault"] is None or spec["fault"].group != "pp")


def test_every_group_is_planned_once(planned_apart):
    dumps = _dumps(JOBS[0])
    views = matcher.build_views(dumps, build_layout(dumps, (), None))
    here = matcher._planned(views)
    for processes in (2, 3, 8, 64):
        parts = list(matcher._plans_apart(views, processes))
        assert len(parts) >= 2 and {gid: plan for part in parts for gid, plan in part.items()} == here
        assert sum(map(len, parts)) == len(here)
    # Sixteen shares of 25 groups: this process keeps building every match, and plans less.
    work = {view.group.id: matcher._work(view) for view in views}
    shares = matcher._shares(views, work, 16)
    assert len(shares[0]) < max(len(share) for share in shares[1:])


def test_a_small_job_forks_nothing(monkeypatch):
    started = forks_recorded(monkeypatch)
    dumps = _dumps(JOBS[0])
    assert sum(len(d.entries) for d in dumps) < 2 * matcher.PLAN_ENTRIES_PER_CHILD
    match(dumps, build_layout(dumps, (), None), processes=8)
    assert started == []


def test_no_fork_plans_every_group_here(monkeypatch):
    monkeypatch.setattr(forked, "FORK_FROM_PROCESSES", 2)
    monkeypatch.setattr(matcher, "PLAN_ENTRIES_PER_CHILD", 1)
    forks_refused(monkeypatch)
    dumps = _dumps(JOBS[3])
    layout = build_layout(dumps, (), None)
    assert _as_values(match(dumps, layout, processes=4)) == _as_values(match(dumps, layout))


@pytest.mark.parametrize("answer", ["killed", "unreadable"])
def test_a_child_that_fails_has_its_groups_planned_here(answer, monkeypatch, planned_apart):
    real_collect = forked.Forked.collect

    def failed(self, wait=True):
        real_collect(self, wait)
        if answer == "unreadable":
            raise pickle.UnpicklingError("unexpected posix.system in a child's result")
        return None, -9

    monkeypatch.setattr(forked.Forked, "collect", failed)
    dumps = _dumps(JOBS[4])
    layout = build_layout(dumps, (), None)
    assert _as_values(match(dumps, layout, processes=3)) == _as_values(match(dumps, layout))
    assert planned_apart


def test_below_four_processes_nothing_forks(monkeypatch):
    monkeypatch.setattr(matcher, "PLAN_ENTRIES_PER_CHILD", 1)
    started = forks_recorded(monkeypatch)
    dumps = _dumps(JOBS[0])
    layout = build_layout(dumps, (), None)
    for processes in (2, 3):
        assert _as_values(match(dumps, layout, processes=processes)) == _as_values(match(dumps, layout))
    assert started == []
