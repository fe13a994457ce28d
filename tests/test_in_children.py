"""Work shared among forked children (load/forked.py): each share's result in order, a
failed child's share computed here, and no child left unreaped."""

from __future__ import annotations

import os
import time

import pytest
from helpers import unreaped_children

import frtrace.load.forked as forked
from frtrace.load.forked import each_in_children, in_children

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")


def _square_with_pid(share: int) -> tuple[int, int]:
    return share * share, os.getpid()


def test_each_share_in_order_the_first_here_the_others_in_children():
    results = list(each_in_children(_square_with_pid, [1, 2, 3, 4]))
    assert [value for value, _ in results] == [1, 4, 9, 16]
    pids = [pid for _, pid in results]
    assert pids[0] == os.getpid() and len(set(pids)) == 4
    assert in_children(_square_with_pid, [5, 6])[1][0] == 36


def test_results_come_while_later_children_run():
    seen = []
    for value, _ in each_in_children(_square_with_pid, [1, 2, 3]):
        seen.append(value)
        if value == 1:
            assert seen == [1]  # the first is given before any child is collected
    assert seen == [1, 4, 9]


def test_a_caller_that_stops_early_leaves_no_child_unreaped():
    results = each_in_children(_square_with_pid, list(range(6)))
    assert next(results)[0] == 0
    results.close()
    time.sleep(0.3)  # time for any child left running to finish, and be left a zombie
    assert unreaped_children() == []


def test_a_share_whose_child_cannot_fork_is_computed_here(monkeypatch):
    def refuse(*_):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(forked.Forked, "start", refuse)
    results = list(each_in_children(_square_with_pid, [1, 2, 3]))
    assert results == [(1, os.getpid()), (4, os.getpid()), (9, os.getpid())]


def test_every_child_is_reaped_once_the_results_are_taken():
    assert [value for value, _ in each_in_children(_square_with_pid, list(range(6)))] == [0, 1, 4, 9, 16, 25]
    time.sleep(0.3)
    assert unreaped_children() == []


def test_a_result_taken_without_waiting_for_the_child_to_exit():
    child = forked.Forked.start(_square_with_pid, 7)
    value, pid = child.result(wait=False)
    assert value == 49 and pid == child.pid
    child.reap()
    child.reap()  # once is enough: a second asks nothing of the system
    time.sleep(0.1)
    assert unreaped_children() == []


def test_a_child_that_sends_nothing_is_waited_for_to_say_why():
    child = forked.Forked.start(os._exit, 3)
    assert child.collect(wait=False) == (None, 3)
    assert unreaped_children() == []
