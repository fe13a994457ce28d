"""A rank that skipped a TP collective in a job of one deep pipeline: no like rank shares
its recent ops (every stage's differ), so the like ranks place nobody; but the other
members of the op it now waits in (the pipeline's step-end all_reduce) each issued their
own TP collective of that number before it, so it went past its own. Without that, the
deadlock it caused was pinned on a pipeline neighbour."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate

FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}


@pytest.mark.parametrize("lookahead", [0, 3])
def test_a_tp_skip_in_one_deep_pipeline_is_blamed_on_the_rank_that_skipped(lookahead):
    job = generate(16, 2, 8, steps=3, fault=Fault("skip_op", rank=4, group="tp", step=1), timing=True,
                   lookahead=lookahead, p2p="mixed", seed=1, **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (4,)) == \
        (job.truth["status"], tuple(job.truth["suspect_ranks"]))
    (root,) = [f for f in diagnosis.findings if f.is_root and f.severity == "error"]
    assert root.kind == "not_issued" and root.went_past[4].confirmed and root.went_past[4].like_ranks >= 2


def test_a_rank_merely_behind_in_one_deep_pipeline_is_not_said_to_have_skipped():
    # The healthy twin and a plain hang of the same shape keep their verdicts.
    healthy = generate(16, 2, 8, steps=3, timing=True, p2p="mixed", seed=1, **FAITHFUL)
    hang = generate(16, 2, 8, steps=3, fault=Fault("hang", rank=4, group="tp", step=1), timing=True, p2p="mixed",
                    seed=1, **FAITHFUL)
    for job in (healthy, hang):
        _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
        assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (job.truth["status"], job.truth["suspect_ranks"])
