"""Dumps of only active entries hold nothing of what sibling groups finished, yet a
member's pg_status saying it finished collective #n shows its group ran #n (no member
finishes a collective the others did not join). On an even split, an op the sibling
groups ran belongs to the program: the rank without it never issued it, as the full
dumps of the same job say, rather than its peer issuing an extra op."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate

FAITHFUL = dict(coalesced_events="marker", watchdog_ms=100.0, bubble_ms=100.0, pg_status="work")


def _tp_group_findings(only_active: bool, seed: int, step: int):
    job = generate(16, 2, 2, steps=3, fault=Fault("skip_op", rank=0, group="tp", step=step), timing=True,
                   p2p="plain", only_active=only_active, seed=seed, **FAITHFUL)
    analysis, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    tp = next(v.group.id for v in analysis.device.views if v.group.desc == "tp" and 0 in v.group.ranks)
    return [(f.kind, f.rule, f.own_suspects, f.absent_ranks, f.siblings_issued_it)
            for f in diagnosis.findings if f.group_id == tp]


@pytest.mark.parametrize("seed,step", [(0, 1), (1, 2), (5, 1)])
def test_a_skipped_tp_op_reads_alike_in_full_and_only_active_dumps(seed, step):
    full = _tp_group_findings(False, seed, step)
    assert full == [("not_issued", "divergence.never_issued", (0,), (0,), True)]
    assert _tp_group_findings(True, seed, step) == full


def _verdict(only_active: bool, seed: int, step: int):
    job = generate(16, 2, 2, steps=3, fault=Fault("skip_op", rank=0, group="tp", step=step), timing=True,
                   p2p="plain", only_active=only_active, seed=seed, **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    return job.truth, diagnosis


@pytest.mark.parametrize("seed,step", [(0, 1), (1, 2), (5, 1), (7, 2), (25, 1)])
def test_the_rank_that_skipped_is_blamed_in_only_active_dumps_as_in_full_ones(seed, step):
    """The pipeline and default groups then split evenly too, their members waiting in
    each other's ops round a circle. The rank in the skipper's place in a sibling TP group
    ran the op (its partner's pg_status says it finished it) and waits in the same default
    group collective as the skipper: the skipper went past the op, and is the root."""
    truth, full = _verdict(False, seed, step)
    _, active = _verdict(True, seed, step)
    assert (full.status, full.suspect_ranks) == ("faults", (0,)) == (truth["status"], tuple(truth["suspect_ranks"]))
    assert (active.status, active.suspect_ranks) == ("faults", (0,))
    root = [f for f in active.findings if f.is_root and f.suspect_ranks]
    assert [(f.rule, f.suspect_ranks) for f in root] == [("divergence.never_issued", (0,))]
    assert list(root[0].went_past) == [0] and root[0].went_past[0].confirmed
