"""The confidence the JSON report gives each suspect: in [0, 1], with the evidence it rests on,
and ordered as that evidence deserves. A rank every other member stands against scores
higher than one named by an even split (decided by sibling groups, or by nothing), by a
missing dump, or by pg_status alone. Jobs are built by helpers.job and frtrace.testing.synth."""

import json

import pytest
from helpers import analyse_dicts, job, run_cli, write_job

from frtrace.diagnosis.confidence import BASIS, suspect_confidences
from frtrace.testing.synth import Fault, generate

AR = ["all_reduce"]


def confidences(dumps: dict) -> list:
    analysis, diagnosis = analyse_dicts(dumps, render=False)
    return suspect_confidences(diagnosis, analysis.layout.ranks_missing)


def only(dumps: dict):
    (scored,) = confidences(dumps)
    return scored


def unanimous():
    """Ranks 0-2 wait in all_reduce #4; rank 3 never issued it."""
    return job({r: AR * (4 if r != 3 else 3) for r in range(4)})


def tie_broken_by_siblings():
    """Pair [0, 1]: rank 0 issued #3, rank 1 did not; the sibling pair [2, 3] issued #3 too.
    gloo, so that nothing says rank 1 waits in nothing (which would decide it instead)."""
    groups = {"a": ("pair", (0, 1)), "b": ("pair", (2, 3))}
    return job({0: ["all_reduce@a"] * 3, 1: ["all_reduce@a"] * 2, 2: ["all_reduce@b"] * 3, 3: ["all_reduce@b"] * 3},
               groups=groups, backend="gloo")


def even_split():
    """Two ranks issued #3 and two did not, in a group with no siblings (gloo: nothing else decides)."""
    return job({r: AR * (3 if r < 2 else 2) for r in range(4)}, backend="gloo")


def missing_dump():
    """Ranks 0-2 wait in all_reduce #4; rank 3 left no dump."""
    return {r: d for r, d in unanimous().items() if r != 3}


def pg_status_only():
    """Dumped without collectives: only pg_status says rank 2 enqueued one collective less."""
    dumps = {}
    for rank in range(4):
        enqueued = 4 if rank == 2 else 5
        dumps[rank] = {"version": "2.10", "comm_lib_version": "2.27.5",
                       "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
                       "pg_status": {"0": {"last_enqueued_collective": enqueued, "last_started_collective": -1,
                                           "last_completed_collective": 4}}}
    return dumps


@pytest.mark.parametrize("build, suspect, basis", [
    (unanimous, 3, "unanimous_peers"),
    (tie_broken_by_siblings, 1, "tie_broken_by_siblings"),
    (even_split, 2, "even_split"),
    (missing_dump, 3, "missing_dump"),
    (pg_status_only, 2, "pg_status_only"),
])
def test_each_verdict_names_the_evidence_it_rests_on(build, suspect, basis):
    scored = [c for c in confidences(build()) if c.rank == suspect]
    assert scored and scored[0].evidence[0] == basis
    assert 0 <= scored[0].confidence <= 1


def test_ties_missing_dumps_and_pg_status_score_below_unanimous_peers():
    strong = only(unanimous()).confidence
    sibling_tie = only(tie_broken_by_siblings()).confidence
    split = max(c.confidence for c in confidences(even_split()))
    missing = only(missing_dump()).confidence
    status = only(pg_status_only()).confidence
    assert strong > sibling_tie > split
    assert strong > missing and strong > status
    assert strong >= 0.9 and split <= 0.5


@pytest.mark.parametrize("fault, weaker", [
    (Fault("hang", rank=5, group="tp", step=1), None),
    (Fault("missing_dump_hang", rank=5, group="tp", step=1), "missing_dump"),
])
def test_on_synthetic_jobs_a_missing_dump_scores_below_the_same_hang_with_the_dump(fault, weaker):
    generated = generate(16, tp=4, pp=2, steps=3, fault=fault, seed=1)
    (scored,) = confidences(dict(generated.dumps))
    assert scored.rank == 5
    if weaker:
        assert scored.evidence[0] == weaker and scored.confidence < BASIS["unanimous_peers"] - 0.2
    else:
        assert scored.evidence[0] == "unanimous_peers" and scored.confidence >= 0.9


def test_corroboration_never_lifts_weak_evidence_to_a_strong_score():
    # However many groups wait on a missing rank, it stays below a unanimous verdict.
    generated = generate(16, tp=4, pp=2, steps=3, fault=Fault("missing_dump_hang", rank=5, group="tp", step=1), seed=1)
    (scored,) = confidences(dict(generated.dumps))
    assert scored.confidence <= BASIS["missing_dump"] + 0.05 < BASIS["one_peer"]


def test_the_json_report_carries_one_entry_per_suspect_and_the_text_shows_it(tmp_path):
    directory = write_job(tmp_path / "job", unanimous())
    report = json.loads(run_cli([directory, "--format", "json", "--workers", "1"]).stdout)
    (entry,) = report["suspect_confidence"]
    assert (entry["rank"], entry["evidence"][0], entry["finding"]["rule"]) == (3, "unanimous_peers", "divergence.never_issued")
    assert [c["rank"] for c in report["suspect_confidence"]] == report["suspect_ranks"]
    text = run_cli([directory, "--workers", "1"]).stdout.splitlines()
    assert text[1] == f"Suspect ranks: 3 (confidence {entry['confidence']:.2f}: unanimous peers)"


def test_no_suspect_no_confidence(tmp_path):
    healthy = write_job(tmp_path / "healthy", job({r: AR * 3 for r in range(4)}))
    assert json.loads(run_cli([healthy, "--format", "json", "--workers", "1"]).stdout)["suspect_confidence"] == []
