"""Work shared among forked children (load/forked.py): each share's result in order, a
failed child's share computed here, and no child left unreaped."""

from __future__ import annotations

import os
import time

import pytest

import frtrace.load.forked as forked
from frtrace.load.forked import each_in_children, in_children

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")


def _square_with_pid(share: int) -> tuple[int, int]:
    return share * share, os.getpid()


def _unreaped_children() -> list[int]:
    """Our children that have exited and not been waited for (zombies)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] == "Z":
            found.append(int(name))
    return found


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
    assert _unreaped_children() == []


def test_a_share_whose_child_cannot_fork_is_computed_here(monkeypatch):
    def refuse(*_):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(forked.Forked, "start", refuse)
    results = list(each_in_children(_square_with_pid, [1, 2, 3]))
    assert results == [(1, os.getpid()), (4, os.getpid()), (9, os.getpid())]
