"""A healthy job dumped by hand while it ran: each rank's dump is a picture of its own
moment, a few milliseconds from the others', so a rank dumped early shows its peers gone
on without it (frtrace.testing.inject.dumped_at). Nothing hangs, and a FAULT is the worst
verdict frtrace can give such a job; a hang that lasted until the dumps is settled, and
its culprit is still named."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.report.render import render_text
from frtrace.testing.inject import dumped_at, only_active
from frtrace.testing.synth import Fault, generate
from frtrace.util import fold_ranks

MS = 1_000_000


def _while_running(tp: int, pp: int, *, p2p: str, seed: int, share: float, active_only: bool = False) -> dict:
    """A 16-rank job's dumps, rank r's taken (r * 7 mod 21) ms after the moment rank 0 created
    the op at `share` of its entries; with `active_only`, as onlyActive writes them, with
    pg_status's started and finished as the watchdog saw them 50 ms before each dump."""
    job = generate(16, tp, pp, steps=3, timing=True, seed=seed, p2p=p2p,
                   pg_status="work" if active_only else "collectives")
    named = {rank: (f"rank_{rank}", dump) for rank, dump in dict(job.dumps).items()}
    created = sorted(entry["time_created_ns"] for entry in named[0][1]["entries"])
    moment = created[int(len(created) * share)]
    dumps = dumped_at(named, {rank: moment + rank * 7 % 21 * MS for rank in named},
                      polled_ns=50 * MS if active_only else 0)
    if active_only:
        dumps = only_active(dumps)
    return {rank: dump for rank, (_, dump) in dumps.items()}


@pytest.mark.parametrize("tp, pp, p2p, seed", [(2, 2, "plain", 0), (4, 2, "batched", 1), (4, 1, "plain", 1)])
def test_a_job_dumped_while_it_ran_blames_nobody(tp, pp, p2p, seed):
    analysis, diagnosis = analyse_dicts(_while_running(tp, pp, p2p=p2p, seed=seed, share=0.66), render=False)

    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    assert diagnosis.verdict.startswith("INCONCLUSIVE: the job was still running when dumped: ")
    lagging = [f for f in diagnosis.findings if f.rule == "frontier.lagging_ranks"]
    assert len(lagging) == 1 and lagging[0].severity == "warning" and lagging[0].ranks
    # What a settled hang would have blamed is kept, as an in-flight warning that blames nobody.
    left_open = [f for f in diagnosis.findings if "suspects_if_settled" in f.facts]
    assert left_open and all(f.kind == "in_flight" and f.severity == "warning" and not f.suspect_ranks
                             and (f.caused_by, f.link) == (lagging[0], "running") for f in left_open)
    # The first screen: the verdict, the one job-wide warning, notes, the rest folded.
    text = render_text(analysis, diagnosis)
    before_folded = text[:text.index("Consequences of the root cause")]
    assert before_folded.count("[warning: in_flight] the job was still running when dumped") == 1
    assert before_folded.count("[warning") == 1 and "[error" not in before_folded
    assert {f.facts["kind_if_settled"] for f in left_open} <= {"not_issued", "extra_op", "p2p_unmatched", "stuck"}
    assert set(lagging[0].facts["running_ranks"]) <= set(lagging[0].ranks)


@pytest.mark.parametrize("tp, pp, p2p, seed, share", [(2, 1, "plain", 0, 0.66), (2, 1, "plain", 2, 0.7),
                                                      (2, 2, "plain", 0, 0.66), (4, 2, "batched", 1, 0.66)])
def test_only_active_dumps_of_a_running_job_blame_nobody(tp, pp, p2p, seed, share):
    dumps = _while_running(tp, pp, p2p=p2p, seed=seed, share=share, active_only=True)

    _, diagnosis = analyse_dicts(dumps, render=False)

    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    # A rank that enqueued an op and no longer holds it finished it, whatever the watchdog's
    # pg_status last saw finish: no rank is said to have skipped a number it enqueued.
    assert not [f for f in diagnosis.findings if f.rule == "divergence.gap"]


def test_an_op_a_rank_enqueued_and_no_longer_holds_is_finished_not_skipped():
    # Only active entries, pg_status's finished from the watchdog's poll 50 ms back: rank 12
    # holds DP _all_gather_base #6, which rank 4 enqueued (its pg_status says so) and no
    # longer holds. It finished it, though its pg_status says it finished nothing of the
    # group: nobody went ahead of rank 4 there.
    dumps = _while_running(2, 1, p2p="plain", seed=0, share=0.66, active_only=True)
    dp_group = next(e for e in dumps[12]["entries"] if e["collective_seq_id"] == 6)
    assert dp_group["process_group"][0] == "25"
    status = dumps[4]["pg_status"][str(dp_group["pg_id"])]  # pg ids alike on every rank here
    assert status["last_completed_collective"] < 6 <= status["last_enqueued_collective"]
    assert not [e for e in dumps[4]["entries"] if e["process_group"][0] == "25"]

    _, diagnosis = analyse_dicts(dumps, render=False)

    assert not [f for f in diagnosis.findings
                if f.pg_name == "25" and f.collective_seq_id == 6 and f.kind in ("not_issued", "extra_op")]


@pytest.mark.parametrize("only_active_dumps", [False, True])
def test_a_gpu_stalled_until_the_dumps_is_still_named(only_active_dumps):
    # The same job shape with rank 5's GPU stopped: a settled hang, no rank behind its peers
    # but the culprit, so the lag says nothing of a job still running.
    job = generate(16, 2, 2, steps=3, timing=True, seed=0, only_active=only_active_dumps,
                   fault=Fault("gpu_error", rank=5, group="tp"))

    _, diagnosis = analyse_dicts(dict(job.dumps), render=False)

    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (5,))
    assert not [f for f in diagnosis.findings if "suspects_if_settled" in f.facts]


def test_a_job_of_many_ranks_dumped_while_it_ran_says_so_in_a_few_lines():
    # 512 ranks (TP 8 x PP 4 x DP 16), each dumped (r * 7 mod 21) ms after the moment: dozens
    # of ranks lag and more would be blamed; the verdict counts them and names a few.
    job = generate(512, 8, 4, steps=3, timing=True, seed=3, p2p="batched")
    named = {rank: (f"rank_{rank}", dump) for rank, dump in dict(job.dumps).items()}
    created = sorted(entry["time_created_ns"] for entry in named[0][1]["entries"])
    moment = created[int(len(created) * 0.66)]
    dumps = dumped_at(named, {rank: moment + rank * 7 % 21 * MS for rank in named})

    _, diagnosis = analyse_dicts({rank: dump for rank, (_, dump) in dumps.items()}, render=False)

    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
    lagging = next(f for f in diagnosis.findings if f.rule == "frontier.lagging_ranks")
    running = lagging.facts["running_ranks"]
    assert len(running) > 8
    assert f"{len(running)} ranks ({fold_ranks(running[:8])},…)" in diagnosis.verdict
    assert len(diagnosis.verdict) < 500
