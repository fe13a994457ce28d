"""The synthetic sweep on dumps shaped the way PyTorch really records them: batched P2P
(per-op entries that stay scheduled, an `nccl:coalesced` end marker holding the state),
coalesced collectives recorded the same way, watchdog-tick discovered times, receivers that
post their recv long before the send, pg_status in the Work's numbering (p2p seqs after P2P
work), only-active dumps and device-side stalls (gpu_error). frtrace's status and suspects
must equal the truth the generator wrote.

Cases frtrace gets wrong today are listed in KNOWN_WRONG (non-strict xfail): the list is the
work order for the diagnosis, and a case that starts passing shows up as XPASS. It is empty:
the 16 only-active pipeline cases it held are right since issue 24 (a rank holding no
collective of a group while its peers wait in one never issued it; a P2P end that never
posted because it waits in another op is a consequence; a data-parallel partner is not
"ahead" of a rank that waits in the pipeline for someone else).
"""

from __future__ import annotations

import itertools

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate

# Pipeline depth -> layout (world, tp, pp): TP groups of four, so that a size mismatch in one
# has a consensus; two data-parallel replicas.
LAYOUTS = {2: (16, 4, 2), 4: (32, 4, 4)}
CULPRIT = 5  # stage 1, tp 1: it sends and receives in both directions when pp > 2
FAULTS = {
    "none": None,
    "hang_tp": Fault("hang", rank=CULPRIT, group="tp", step=1),
    "hang_dp": Fault("hang", rank=CULPRIT, group="dp", step=1),
    "p2p_unmatched": Fault("p2p_unmatched", rank=CULPRIT, group="pp", step=1),
    "size_mismatch": Fault("size_mismatch", rank=CULPRIT, group="tp", step=1),
    "missing_dump": Fault("missing_dump", rank=CULPRIT),
    "gpu_error": Fault("gpu_error", rank=CULPRIT, step=1),
    "gpu_error2": Fault("gpu_error", ranks=(CULPRIT, CULPRIT + 2), step=1),  # two culprits, one TP group
}
# What PyTorch does, always on here; the grid sweeps the rest.
FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}

CASES = [
    (depth, p2p, timing, only_active, fault)
    for depth, p2p, timing, only_active, fault in itertools.product(
        LAYOUTS, ("plain", "batched", "mixed"), (False, True), (False, True), FAULTS)
]


def case_id(case) -> str:
    depth, p2p, timing, only_active, fault = case
    return f"pp{depth}-{p2p}-{'timing' if timing else 'notiming'}-{'active' if only_active else 'full'}-{fault}"


# case id -> what frtrace said when the case was added (status, suspects): see the module doc.
KNOWN_WRONG: dict = {}


def _run(case):
    depth, p2p, timing, only_active, fault = case
    job = generate(*LAYOUTS[depth], steps=3, fault=FAULTS[fault], p2p=p2p, timing=timing,
                   only_active=only_active, **FAITHFUL)
    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)
    return job.truth, diagnosis


def _marks(case):
    reason = KNOWN_WRONG.get(case_id(case))
    return [pytest.mark.xfail(strict=False, reason=f"frtrace says {reason}")] if reason else []


@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c), marks=_marks(c)) for c in CASES])
def test_faithful_sweep_names_the_culprit(case):
    truth, diagnosis = _run(case)
    assert (diagnosis.status, list(diagnosis.suspect_ranks)) == (truth["status"], truth["suspect_ranks"])
