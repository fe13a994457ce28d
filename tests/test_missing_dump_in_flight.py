"""A missing dump in a job dumped mid-op is not blamed for what every group shows.

When every sibling group (the other DP groups of a DP group, say) stands in the same op as
the group whose member left no dump, every member in it and none finished, the whole job
was dumped mid-op (or is stuck alike): the others are not shown waiting for the missing
rank, and a FAULT naming it would send someone after a rank that did nothing wrong. In a
pipeline, only the like group of another replica stands in the op (the later stages have
not reached it: they say nothing either way), and the sends and recvs towards the missing
stage are held alike by the ranks in their places in the other pipeline. When the
siblings went past the op, the group is held up by its missing member, as before."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate


def _without(job, rank: int) -> dict:
    return {r: dump for r, dump in job.dumps.items() if r != rank}


@pytest.mark.parametrize("missing", [0, 3, 6, 13])
def test_a_job_dumped_mid_op_without_one_dump_is_inconclusive_and_blames_nobody(missing):
    job = generate(16, 2, 2, steps=3, fault=Fault("in_flight", rank=1, group="dp", step=1), timing=True, seed=3)
    assert job.truth["status"] == "inconclusive"  # the generator's own judgement of the whole job
    _, diagnosis = analyse_dicts(_without(job, missing), render=False)
    assert diagnosis.status == "inconclusive"
    assert diagnosis.suspect_ranks == ()
    like = [f for f in diagnosis.findings if f.rule == "frontier.in_flight_like_its_siblings"]
    assert [f.ranks for f in like] == [(missing,)]
    assert like[0].severity == "warning" and like[0].evidence["siblings_in_the_same_op"]
    assert not any(f.severity == "error" for f in diagnosis.findings)


@pytest.mark.parametrize("culprit", [2, 9])
def test_a_missing_rank_its_siblings_went_past_is_still_blamed(culprit):
    job = generate(16, 2, 2, steps=3, fault=Fault("missing_dump_hang", rank=culprit, group="dp", step=1), timing=True,
                   seed=3)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (culprit,)) == \
        (job.truth["status"], tuple(job.truth["suspect_ranks"]))
    assert not any(f.rule == "frontier.in_flight_like_its_siblings" for f in diagnosis.findings)


# A pipeline (16 x TP 2 x PP 4) dumped while the first stage's TP groups run all_reduce #6:
# the later stages wait in recvs (or sends) their neighbours have not posted yet.
def _pipeline_mid_tp_op(p2p: str):
    return generate(16, 2, 4, steps=3, fault=Fault("in_flight", rank=1, group="tp", step=1), timing=True, seed=3, p2p=p2p)


@pytest.mark.parametrize("p2p", ["plain", "batched"])
@pytest.mark.parametrize("missing", [0, 9])
def test_a_tp_group_in_the_op_its_like_group_is_in_does_not_blame_its_missing_member(p2p, missing):
    # The other stages' TP groups have not reached #6 yet: they say nothing either way; the
    # like group of the other replica stands in it, unfinished.
    job = _pipeline_mid_tp_op(p2p)
    assert job.truth["status"] == "inconclusive"
    _, diagnosis = analyse_dicts(_without(job, missing), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    like = [f for f in diagnosis.findings if f.rule == "frontier.in_flight_like_its_siblings"]
    assert [f.ranks for f in like] == [(missing,)] and like[0].waiting_ranks
    assert not any(f.severity == "error" for f in diagnosis.findings)


@pytest.mark.parametrize("p2p", ["plain", "batched"])
@pytest.mark.parametrize("missing", [2, 5, 12])
def test_a_send_or_recv_towards_a_missing_stage_its_like_ranks_hold_too_blames_nobody(p2p, missing):
    # The missing stage's neighbour holds a send or recv to it unfinished, as the ranks in
    # its place in the other pipeline do: the missing dump explains nothing they lack.
    job = _pipeline_mid_tp_op(p2p)
    _, diagnosis = analyse_dicts(_without(job, missing), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    like = [f for f in diagnosis.findings if f.rule == "p2p.in_flight_like_its_siblings"]
    assert like and all(f.ranks == (missing,) and f.severity == "warning" for f in like)
    assert not any(f.severity == "error" for f in diagnosis.findings)


@pytest.mark.parametrize("culprit", [1, 6])
def test_a_missing_stage_whose_like_ranks_went_on_is_still_blamed(culprit):
    # The same pipeline, the rank never issuing its TP op and its dump lost: the other
    # replica's ranks went past the op, so its peers wait for it.
    job = generate(16, 2, 4, steps=3, fault=Fault("missing_dump_hang", rank=culprit, group="tp", step=1), timing=True,
                   seed=3, p2p="plain")
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (culprit,)) == \
        (job.truth["status"], tuple(job.truth["suspect_ranks"]))
    assert not any(f.rule.endswith("in_flight_like_its_siblings") for f in diagnosis.findings)
