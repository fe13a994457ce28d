"""The stragglers rule on the other core (frtrace/diagnosis/aside.py): a forked child
computes what the main process would, a failed child costs only time, an unread child is
ended, and a diagnosis with the rule aside is the diagnosis without."""

from __future__ import annotations

import os
import threading

import pytest

from frtrace import diagnosis
from frtrace.diagnosis.aside import Aside
from frtrace.report import render_json
from frtrace.testing.synth import Fault, generate

from helpers import analyse_dicts



@pytest.fixture
def can_fork() -> None:
    """Asked when the test runs: an earlier test may have left a thread running."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        pytest.skip("no fork here (or other threads run)")


@pytest.mark.usefixtures("can_fork")
def test_a_child_computes_it_and_the_result_comes_back_as_computed():
    parent = os.getpid()
    with Aside(lambda: (os.getpid(), {"lateness_ms": {"3": 41.25}, "ranks": (3,)})) as aside:
        assert aside.forked
        child, value = aside.result()
    assert child != parent and value == {"lateness_ms": {"3": 41.25}, "ranks": (3,)}
    assert not aside.forked


@pytest.mark.usefixtures("can_fork")
def test_a_failed_child_leaves_the_caller_to_compute_it():
    parent = os.getpid()

    def only_here() -> int:
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        return 7

    with Aside(only_here) as aside:
        assert aside.forked and aside.result() == 7
    with Aside(lambda: os._exit(0) if os.getpid() != parent else 8) as aside:  # a child that sends nothing
        assert aside.result() == 8


def test_not_wanted_it_is_computed_by_the_caller():
    parent = os.getpid()
    with Aside(os.getpid, wanted=False) as aside:
        assert not aside.forked and aside.result() == parent


@pytest.mark.usefixtures("can_fork")
def test_an_unread_child_is_ended_and_reaped():
    with Aside(lambda: threading.Event().wait(60)) as aside:
        assert aside._child is not None
        pid = aside._child.pid
    with pytest.raises(ChildProcessError):  # reaped: no such child any more
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.usefixtures("can_fork")
@pytest.mark.parametrize("params", [
    dict(world_size=8, tp=2, pp=2, steps=6, timing=True, fault=Fault("straggler", rank=3, straggler_ms=40.0)),
    dict(world_size=16, tp=2, pp=4, steps=4, timing=True, fault=Fault("hang", rank=5, group="tp", step=2)),
], ids=["straggler", "pipeline_hang"])
def test_a_diagnosis_with_the_stragglers_rule_aside_is_the_diagnosis_without(monkeypatch, params):
    analysis, inline = analyse_dicts(dict(generate(**params).dumps), render=False)
    forked = []

    class Recorded(Aside):
        def __init__(self, function, wanted: bool = True) -> None:
            super().__init__(function, wanted)
            forked.append(self.forked)

    monkeypatch.setattr(diagnosis, "Aside", Recorded)
    monkeypatch.setattr(diagnosis, "ASIDE_MIN_RANKS", 0)
    aside = diagnosis.diagnose(analysis)
    monkeypatch.setattr(diagnosis, "ASIDE_MIN_RANKS", 10**9)
    here = diagnosis.diagnose(analysis)
    assert forked == [True, False]
    assert render_json(analysis, aside) == render_json(analysis, here) == render_json(analysis, inline)
    if params["fault"].kind == "straggler":
        assert any(f.kind == "straggler" for f in aside.findings)
