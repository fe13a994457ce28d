"""Two hosts that stop issuing at one moment (NVRx's LOCK_GIL on two ranks): the second
stopped while it waited in an op its victims wait in too, so what it holds is theirs. But
a host runs ahead of its GPU: its victims, waiting alike, queued the ops after that one,
and it queued none (`stopped_hosts.queued_less_than_like_ranks`)."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate

FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}


def _two_hosts_stopped(lookahead: int, only_active: bool, p2p: str = "plain"):
    """16 ranks, TP 2 x PP 2 x DP 4, timing on; ranks 8 and 11 stop issuing at one moment
    from rank 8's second step's TP all_reduce on, each wherever it is in its program;
    `lookahead`: ops a host enqueues ahead of the one its GPU waits in."""
    return generate(16, tp=2, pp=2, steps=4, timing=True, p2p=p2p, only_active=only_active, seed=456,
                    pg_order="same", lookahead=lookahead,
                    fault=Fault("hang", rank=8, group="tp", step=2, ranks=(8, 11), at_once=True), **FAITHFUL)


@pytest.mark.parametrize("only_active", [False, True], ids=["whole", "only-active"])
def test_a_host_that_stopped_while_waiting_with_its_victims_is_named_too(only_active):
    job = _two_hosts_stopped(lookahead=3, only_active=only_active)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert job.truth["suspect_ranks"] == [8, 11]
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (8, 11))
    stopped = [f for f in diagnosis.findings if f.rule == "stopped_hosts.queued_less_than_like_ranks"]
    assert [f.suspect_ranks for f in stopped] == [(11,)]


def test_without_run_ahead_nothing_tells_the_second_host_from_its_victims():
    # No host queues anything after the op it waits in: the rule has nothing to compare,
    # and only the first culprit is named (never an innocent rank).
    job = _two_hosts_stopped(lookahead=0, only_active=False)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (8,))
    assert not [f for f in diagnosis.findings if f.rule == "stopped_hosts.queued_less_than_like_ranks"]


def test_a_stopped_gpus_host_queueing_on_does_not_blame_its_partner():
    # Two GPUs stop (ranks 3 and 12); rank 12's host queues on behind the op its GPU never
    # finishes, while its TP partner 13, waiting alike, queued nothing, as every other
    # rank in their place did: one like rank queueing more is no host that stopped.
    job = generate(16, tp=2, pp=4, steps=3, timing=True, p2p="batched", seed=449, pg_order="same",
                   fault=Fault("gpu_error", rank=3, group="tp", step=2, ranks=(3, 12)), **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert diagnosis.status == "faults" and set(diagnosis.suspect_ranks) <= {3, 12}
