"""ForkedServer: one forked child computing a function for request after request (what a
dask worker decodes its batches in): the same child serves every call, a child that dies
costs its call and serves no more, its replies are read as frtrace's own records only,
and a child never keeps another server's pipe open (or that server could not end)."""

from __future__ import annotations

import os
import pickle
import threading
from collections import OrderedDict

import pytest

from frtrace.load.forked_server import ForkedServer
from frtrace.model import LoadIssue


def _work(kind: str, value: int):
    if kind == "die":
        os._exit(7)
    if kind == "foreign":
        return OrderedDict(value=value)  # not one of frtrace's records
    return LoadIssue(str(os.getpid()), str(value * 2))


def test_one_child_serves_every_call():
    server = ForkedServer.start(_work)
    try:
        replies = [server.call("work", n) for n in range(5)]
    finally:
        server.close()
    assert [(issue.problem, code) for issue, code in replies] == [(str(2 * n), None) for n in range(5)]
    assert {issue.path for issue, _ in replies} == {str(server.pid)} != {str(os.getpid())}
    assert not server.alive


def test_a_child_that_dies_costs_its_call_and_serves_no_more():
    server = ForkedServer.start(_work)
    assert server.call("work", 1)[1] is None
    assert server.call("die", 0) == (None, 7)
    assert not server.alive and server.call("work", 2) == (None, 7)
    fresh = ForkedServer.start(_work)  # what its owner does next
    try:
        assert fresh.call("work", 3)[0].problem == "6"
    finally:
        fresh.close()


def test_a_reply_is_read_as_frtrace_records_only():
    server = ForkedServer.start(_work)
    try:
        with pytest.raises(pickle.UnpicklingError, match="collections.OrderedDict"):
            server.call("foreign", 1)
    finally:
        server.close()


def test_a_server_ends_when_its_requests_end_though_another_was_forked_since():
    first = ForkedServer.start(_work)
    second = ForkedServer.start(_work)  # forked holding a copy of the first's request pipe, which it closes
    try:
        ended = threading.Thread(target=first._end)  # no kill: the child must see its requests end
        ended.start()
        ended.join(timeout=20)
        assert not ended.is_alive() and not first.alive
        assert second.call("work", 4)[0].problem == "8"
    finally:
        first.close()
        second.close()


def test_a_result_left_pickled_is_what_call_would_read():
    server = ForkedServer.start(_work)
    try:
        reply, exitcode = server.call_pickled("work", 21)
        issue, _ = server.call("work", 21)
    finally:
        server.close()
    assert exitcode is None and isinstance(reply, bytes)
    assert pickle.loads(reply) == issue == LoadIssue(str(server.pid), "42")
