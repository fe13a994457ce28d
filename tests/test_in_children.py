"""Work shared among forked children (load/forked.py): each share's result in order, a
failed child's share computed here, and no child left unreaped."""

from __future__ import annotations

import os
import time

import pytest
from helpers import unreaped_children

from frtrace.load import forked
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
    monkeypatch.setattr(forked.Forked, "start_each", lambda function, shares: [None] * len(shares))
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


def _share_facts(share: int) -> tuple[int, int, int]:
    return share * 3, os.getpid(), os.getppid()


def test_the_children_are_forked_as_a_tree_this_process_forking_one():
    here = os.getpid()
    results = list(each_in_children(_share_facts, list(range(13))))
    assert [value for value, _, _ in results] == [3 * share for share in range(13)]
    pids = [pid for _, pid, _ in results]
    assert pids[0] == here and len(set(pids)) == 13
    parents = [parent for _, _, parent in results[1:]]
    assert parents.count(here) == 1  # the first child only: it and its children fork the rest
    time.sleep(0.3)
    assert unreaped_children() == []


def _dies_on_three(share: int) -> tuple[int, int, int]:
    if share == 3 and os.getpid() != MAIN_PID:
        os._exit(7)
    return _share_facts(share)


MAIN_PID = os.getpid()


def test_a_share_whose_child_dies_is_computed_here():
    assert os.getpid() == MAIN_PID  # the test runs in the process that imported it
    results = list(each_in_children(_dies_on_three, list(range(8))))
    assert [value for value, _, _ in results] == [3 * share for share in range(8)]
    assert results[3][1] == MAIN_PID and results[2][1] != MAIN_PID and results[4][1] != MAIN_PID
    time.sleep(0.3)
    assert unreaped_children() == []


def test_a_child_that_cannot_fork_its_part_computes_it_itself(monkeypatch):
    real_fork, forks = os.fork, []

    def first_only():  # in this process the first fork succeeds; in the child every later one fails
        if forks:
            raise OSError("Resource temporarily unavailable")
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", first_only)
    results = list(each_in_children(_share_facts, list(range(6))))
    assert [value for value, _, _ in results] == [3 * share for share in range(6)]
    assert len({pid for _, pid, _ in results[1:]}) == 1 and results[1][1] != os.getpid()


def _megabytes(count: int) -> bytes:
    return b"x" * (count << 20)


def _gone(pid: int, within: float) -> bool:
    """Whether the child `pid` exits within `within` seconds (left for its parent to reap)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="needs os.waitid")
def test_a_spilling_child_is_gone_before_its_large_result_is_read():
    """A pipe holds 64 KiB: a child sending more lives on until its parent reads it. One
    that spills its result to a file is gone as soon as it is done, and the result is the
    same."""
    piped = forked.Forked.start(_megabytes, 2)
    assert not _gone(piped.pid, 0.5)
    assert piped.result() == _megabytes(2)
    spilled = forked.Forked.start_spilling(_megabytes, 2)
    assert _gone(spilled.pid, 10)
    assert spilled.collect() == (_megabytes(2), None)
    assert spilled.pid not in unreaped_children()


def _dies(_: int) -> bytes:
    os._exit(5)


def test_a_spilling_child_that_dies_says_how():
    assert forked.Forked.start_spilling(_dies, 1).collect() == (None, 5)
    assert forked.Forked.try_start(_dies, 1, spilling=True).result() is None
