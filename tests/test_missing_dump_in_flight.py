"""A missing dump in a job dumped mid-op is not blamed for what every group shows.

When every sibling group (the other DP groups of a DP group, say) stands in the same op as
the group whose member left no dump, every member in it and none finished, the whole job
was dumped mid-op (or is stuck alike): the others are not shown waiting for the missing
rank, and a FAULT naming it would send someone after a rank that did nothing wrong. When
the siblings went past the op, the group is held up by its missing member, as before."""

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
