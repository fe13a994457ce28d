"""The report's `matched` counts: what the matcher found, counted one match at a time."""

from __future__ import annotations

import pytest
from helpers import write_synth_job

from frtrace.diagnosis import diagnose
from frtrace.match.analysis import analyze
from frtrace.report.render import report_dict
from frtrace.testing.synth import Fault, generate


def _counted_one_by_one(matches) -> dict:
    agreed = partial = mismatched = 0
    for match in matches.collectives:
        if match.disagreement is not None:
            mismatched += 1
        elif match.not_issued or match.no_dump:
            partial += 1
        else:
            agreed += 1
    paired = [p.send is not None and p.recv is not None for p in matches.p2p]
    return {"collectives": len(matches.collectives), "collectives_agreed": agreed, "collectives_partial": partial,
            "collectives_mismatched": mismatched, "p2p_pairs": sum(paired), "p2p_unpaired": paired.count(False)}


@pytest.mark.parametrize("fault, expect", [
    (None, {"collectives_partial": 0, "collectives_mismatched": 0, "p2p_unpaired": 0}),
    (Fault("size_mismatch", rank=3, group="tp"), {"collectives_mismatched": 1}),
    (Fault("missing_dump", rank=5), {"collectives_mismatched": 0}),
    (Fault("p2p_unmatched", rank=2, group="pp"), {"collectives_mismatched": 0}),
])
def test_matched_counts_are_the_matches_counted_one_by_one(tmp_path, fault, expect):
    job = generate(16, 2, 2, steps=3, fault=fault)
    analysis = analyze([write_synth_job(tmp_path / "dumps", job)])
    counts = report_dict(analysis, diagnose(analysis))["matched"]
    assert counts == _counted_one_by_one(analysis.matches)
    assert {name: counts[name] for name in expect} == expect
    assert counts["collectives"] > 0 and counts["p2p_pairs"] > 0
    if fault is not None and fault.kind == "missing_dump":
        assert counts["collectives_partial"] > 0  # every collective of the missing rank's groups
    if fault is not None and fault.kind == "p2p_unmatched":
        assert counts["p2p_unpaired"] > 0
