"""A rank whose dump is missing shows nothing of where it waits. Its peers waiting for it
in an op it never joined blame it only when nothing else explains the stop (a host that
hung hard enough to write no dump); beside a root cause the other dumps show, it follows
from that one, since a rank stuck behind a hang leaves its peers waiting the same way."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.diagnosis.finding import Finding
from frtrace.diagnosis.linking import _unseen_behind_seen
from frtrace.testing.synth import Fault, generate


def _tp_hang_at_rank_5():
    return generate(16, 2, 4, steps=3, seed=0, fault=Fault("hang", rank=5, group="tp"), timing=True,
                    coalesced_events="marker", watchdog_ms=100.0, pg_status="work")


@pytest.mark.parametrize("lost", [0, 3, 6, 7])
def test_a_dump_lost_beside_a_hang_makes_no_suspect(lost):
    dumps = {rank: dump for rank, dump in _tp_hang_at_rank_5().dumps.items() if rank != lost}
    _, diagnosis = analyse_dicts(dumps)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (5,)), diagnosis.verdict
    unseen = [f for f in diagnosis.findings if f.link == "unseen"]
    assert unseen and all(f.own_suspects == (lost,) and f.caused_by is not None for f in unseen)
    assert all("left no dump to show where it waits" in f.message for f in unseen)


@pytest.mark.parametrize("culprit", [2, 5, 11])
def test_a_host_that_hung_and_wrote_no_dump_is_still_named(culprit):
    job = generate(16, 2, 4, steps=3, seed=1, fault=Fault("missing_dump_hang", rank=culprit, group="tp"), timing=True,
                   coalesced_events="marker", watchdog_ms=100.0, pg_status="work")
    assert culprit not in job.dumps
    _, diagnosis = analyse_dicts(dict(job.dumps))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (culprit,)), diagnosis.verdict


def test_a_hung_host_without_a_dump_is_named_alone_where_its_peer_waits_for_it():
    # Rank 6 hung in the pipeline and wrote no dump; rank 4, its pipeline peer, waits in
    # the all_reduce #3 rank 6 never issued. Rank 4's pg_status row for the group says 3
    # finished, but that is its batch #3 of sends and recvs (the numberings meet), and
    # read as the all_reduce it made rank 6 look as if it took part: ranks stuck behind
    # then split a two-member DP group, and that even split named rank 4 beside rank 6.
    job = generate(8, 2, 2, steps=3, seed=592, timing=False, p2p="batched", pg_order="rotated", hashed_names=True,
                   coalesced_events="marker", watchdog_ms=100.0, bubble_ms=100.0, pg_status="work",
                   fault=Fault("missing_dump_hang", rank=6, group="pp", step=2))
    _, diagnosis = analyse_dicts(dict(job.dumps))
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (6,)), diagnosis.verdict
    root = next(f for f in diagnosis.findings if f.is_root and f.own_suspects)
    assert (root.kind, root.pg_desc, root.collective_seq_id, root.waiting_ranks) == ("missing_dump", "pp", 3, (4,))


def _root(kind: str, suspects: tuple[int, ...], tie: bool = False) -> Finding:
    return Finding(kind, "test", "error", 1, "1", "dp", "all_reduce", 3, None, suspects, suspects, "", tie=tie)


@pytest.mark.parametrize("tie", [True, False])
def test_a_root_blaming_only_a_rank_without_a_dump_follows_only_from_a_root_that_decides(tie):
    # A host that hung hard enough to write no dump leaves its peers waiting; a root that
    # names ranks whose dumps show what they did explains it ("unseen"), but not an even
    # split blamed on the ranks that did not arrive: that decides nothing.
    lost, other = _root("missing_dump", (6,)), _root("not_issued", (4,), tie=tie)
    _unseen_behind_seen([other, lost], frozenset({6}))
    assert (lost.caused_by, lost.link) == ((None, None) if tie else (other, "unseen"))


@pytest.mark.parametrize("lost", [3, 7])
def test_a_ring_step_skipped_towards_a_rank_without_a_dump_is_still_seen(lost):
    # Rank 5 skips a ring step of its context-parallel ring; the ring partner whose dump
    # is lost would have shown the recv it waits in. The ring peers' ops alone show rank
    # 5's ops running ahead of theirs, and the lost rank is no suspect.
    job = generate(16, 2, 4, steps=3, seed=0, ring=True, p2p="batched", timing=True, coalesced_events="marker",
                   watchdog_ms=100.0, bubble_ms=100.0, pg_status="work",
                   fault=Fault("skip_ring_step", rank=5, group="cp", step=1))
    _, diagnosis = analyse_dicts({rank: dump for rank, dump in job.dumps.items() if rank != lost})
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (5,)), diagnosis.verdict
    root = next(f for f in diagnosis.findings if f.is_root and f.suspect_ranks)
    assert root.rule == "p2p.skipped_ring_step" and f"rank {lost}, the other end, left no dump" in root.message


def test_a_pipeline_is_no_ring_to_judge_a_rank_by_when_its_partner_left_no_dump():
    # Rank 3 hung and wrote no dump; the pipeline's stages (whose ops may look alike)
    # are not ring peers, so the stage that waits on rank 3 is not judged against them.
    job = generate(24, 2, 3, steps=3, seed=667, timing=False, p2p="mixed", lookahead=2, coalesced_events="marker",
                   watchdog_ms=100.0, bubble_ms=100.0, pg_status="work",
                   fault=Fault("missing_dump_hang", rank=3, group="tp", step=1))
    _, diagnosis = analyse_dicts(dict(job.dumps))
    assert not [f for f in diagnosis.findings if f.rule == "p2p.skipped_ring_step"]
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (3,)), diagnosis.verdict
