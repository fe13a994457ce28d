"""The report's match counts (`matched` in the JSON report) against the matches one by one."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.report.render import _match_counts
from frtrace.testing.synth import Fault, generate


@pytest.mark.parametrize("kind,group", [("p2p_unmatched", "pp"), ("hang", "tp"), ("size_mismatch", "tp")])
def test_counts_are_the_matches_counted_one_by_one(kind, group):
    job = generate(32, 2, 4, steps=4, fault=Fault(kind, rank=5, group=group, step=2), timing=True, seed=3)
    analysis, _ = analyse_dicts(dict(job.dumps), render=False)
    counts = _match_counts(analysis)
    pairs = analysis.matches.p2p
    assert counts["p2p_pairs"] == sum(1 for pair in pairs if pair.paired)
    assert counts["p2p_unpaired"] == sum(1 for pair in pairs if not pair.paired)
    collectives = analysis.matches.collectives
    assert counts["collectives_mismatched"] == sum(1 for m in collectives if m.disagreement is not None)
    assert counts["collectives_agreed"] == sum(1 for m in collectives
                                               if m.disagreement is None and not m.not_issued and not m.no_dump)
    if kind == "p2p_unmatched":
        assert counts["p2p_unpaired"] > 0 and counts["p2p_pairs"] > 0
