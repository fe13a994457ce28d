"""Creation times are read on each host's own clock: a host whose clock is set apart
from the others' makes its ranks look late (or early) by the offset at every collective.
A straggler's peers wait for it, and each reads that wait on its own clock; ranks whose
peers never waited that long are not reported late, however far their clocks are off."""

from __future__ import annotations

import random

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import Fault, generate

_TIME_FIELDS = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


def _on_a_clock_set_apart(dumps: dict, ranks: tuple[int, ...], offset_s: float) -> dict:
    """The dumps with every time of `ranks` (on a host of their own) read `offset_s` later."""
    offset_ns = int(offset_s * 1e9)
    for rank in ranks:
        for entry in dumps[rank]["entries"]:
            for field in _TIME_FIELDS:
                if entry.get(field):
                    entry[field] += offset_ns
    return dumps


def _stragglers(dumps: dict) -> tuple[str, list[tuple[int, ...]]]:
    _, diagnosis = analyse_dicts(dumps)
    return diagnosis.status, [f.suspect_ranks for f in diagnosis.findings if f.kind == "straggler"]


@pytest.mark.parametrize("offset_s", [2.0, 60.0])
def test_a_host_whose_clock_is_ahead_makes_no_straggler_of_a_healthy_job(offset_s):
    job = generate(8, 2, 1, steps=6, timing=True, seed=2, coalesced_events="marker", watchdog_ms=100.0)
    assert job.truth["status"] == "healthy"
    dumps = _on_a_clock_set_apart(dict(job.dumps), (3,), offset_s)
    assert _stragglers(dumps) == ("healthy", [])


@pytest.mark.parametrize("offset_s", [0.0, 60.0])
def test_a_straggler_is_still_named_beside_a_host_whose_clock_is_ahead(offset_s):
    job = generate(8, 2, 1, steps=6, timing=True, seed=2, coalesced_events="marker", watchdog_ms=100.0,
                   fault=Fault("straggler", rank=5, straggler_ms=250.0))
    dumps = _on_a_clock_set_apart(dict(job.dumps), (3,), offset_s)
    assert _stragglers(dumps) == ("healthy", [(5,)])


def _slow_from(dumps: dict, rank: int, fraction: float, late_ms: float, peers_wait: bool = True) -> dict:
    """The dumps with `rank` issuing each collective created after `fraction` of the job's
    entries `late_ms` late (a host that became slow), and, with `peers_wait`, every member
    seeing it finish that much later (they waited for it). Without, its clock jumped."""
    times = sorted(entry["time_created_ns"] for dump in dumps.values() for entry in dump["entries"])
    cut, late_ns = times[int(fraction * (len(times) - 1))], int(late_ms * 1e6)
    for member, dump in dumps.items():
        fields = _TIME_FIELDS if member == rank else _TIME_FIELDS[1:] if peers_wait else ()
        for entry in dump["entries"]:
            if not entry["is_p2p"] and entry["time_created_ns"] >= cut:
                for field in fields:
                    if entry.get(field):
                        entry[field] += late_ns
    return dumps


@pytest.mark.parametrize("fraction", [0.5, 0.7])
def test_a_rank_that_became_slow_within_the_window_is_named_a_straggler(fraction):
    """Late at its newest collectives in every group, on time before: a host that began
    to throttle. Its peers waited for it; the rank it merely held up is late only where it
    meets others next, and is not named."""
    job = generate(8, 2, 1, steps=12, timing=True, seed=2, coalesced_events="marker", watchdog_ms=100.0)
    _, diagnosis = analyse_dicts(_slow_from(dict(job.dumps), 5, fraction, 250.0))
    stragglers = [f for f in diagnosis.findings if f.kind == "straggler"]
    assert diagnosis.status == "healthy" and [f.suspect_ranks for f in stragglers] == [(5,)]
    assert stragglers[0].facts["late_lately"] == [5] and "newest collectives late" in stragglers[0].message


def test_a_clock_that_jumped_within_the_window_makes_no_straggler():
    """The same times on the rank alone (its host's clock stepped forward): nobody waited."""
    job = generate(8, 2, 1, steps=12, timing=True, seed=2, coalesced_events="marker", watchdog_ms=100.0)
    assert _stragglers(_slow_from(dict(job.dumps), 5, 0.6, 250.0, peers_wait=False)) == ("healthy", [])


@pytest.mark.parametrize("world, tp, pp, seed", [(8, 2, 1, 0), (16, 2, 2, 1), (16, 4, 1, 3)])
def test_a_rank_late_now_and_then_is_named_a_straggler_and_those_it_held_up_are_not(world, tp, pp, seed):
    """Late at 30 % of its ops (a data loader that stalls now and then): its peers wait
    for it each time, and the ranks it held up (its TP peers at their next DP collective,
    the stage it feeds) are late only where they meet others next, so only it is named."""
    culprit = (seed * 7) % world
    job = generate(world, tp, pp, steps=12, timing=True, seed=seed, lookahead=seed % 3, coalesced_events="marker",
                   watchdog_ms=100.0, bubble_ms=100.0, pg_status="work",
                   fault=Fault("straggler", rank=culprit, straggler_ms=250.0, straggler_share=0.3))
    _, diagnosis = analyse_dicts(dict(job.dumps))
    stragglers = [f for f in diagnosis.findings if f.kind == "straggler"]
    assert diagnosis.status == "healthy" and [f.suspect_ranks for f in stragglers] == [(culprit,)]
    assert list(stragglers[0].facts["late_often"]) == [str(culprit)]
    assert "late again and again" in stragglers[0].message


def _late_at_every_other(dumps: dict, rank: int, late_ms: float, peers_wait: bool) -> dict:
    """The dumps with `rank` issuing every other collective of each group `late_ms` late,
    and, with `peers_wait`, every member seeing those finish that much later (they waited
    for it). Without, its clock jumped back and forth."""
    late_ns = int(late_ms * 1e6)
    for member, dump in dumps.items():
        fields = _TIME_FIELDS if member == rank else _TIME_FIELDS[1:] if peers_wait else ()
        for entry in dump["entries"]:
            if not entry["is_p2p"] and entry["collective_seq_id"] % 2:
                for field in fields:
                    if entry.get(field):
                        entry[field] += late_ns
    return dumps


def test_a_rank_late_at_every_other_collective_is_named_only_where_its_peers_waited():
    job = generate(8, 2, 1, steps=12, timing=True, seed=2, coalesced_events="marker", watchdog_ms=100.0)
    assert _stragglers(_late_at_every_other(dict(job.dumps), 5, 250.0, peers_wait=True)) == ("healthy", [(5,)])
    job = generate(8, 2, 1, steps=12, timing=True, seed=2, coalesced_events="marker", watchdog_ms=100.0)
    assert _stragglers(_late_at_every_other(dict(job.dumps), 5, 250.0, peers_wait=False)) == ("healthy", [])


def _with_host_noise(dumps: dict, mean_ms: float, seed: int) -> dict:
    """The dumps with each member of each collective arriving at random, exponentially
    `mean_ms` late on average (busy hosts), and every member seeing it finish after the
    last one arrived."""
    rng = random.Random(seed)
    delays: dict[tuple, dict[int, int]] = {}
    for rank, dump in sorted(dumps.items()):
        for entry in dump["entries"]:
            if not entry["is_p2p"]:
                key = (entry["process_group"][0], entry["collective_seq_id"])
                delays.setdefault(key, {})[rank] = int(rng.expovariate(1 / mean_ms) * 1e6)
    for rank, dump in dumps.items():
        for entry in dump["entries"]:
            if not entry["is_p2p"]:
                arrivals = delays[(entry["process_group"][0], entry["collective_seq_id"])]
                entry["time_created_ns"] += arrivals[rank]
                for field in _TIME_FIELDS[1:]:
                    if entry.get(field):
                        entry[field] += max(arrivals.values())
    return dumps


@pytest.mark.parametrize("mean_ms", [20.0, 60.0])
def test_hosts_that_arrive_apart_at_random_make_no_straggler(mean_ms):
    """Every rank of such a job is late now and then, by the noise: none stands out."""
    job = generate(16, 2, 2, steps=12, timing=True, seed=4, coalesced_events="marker", watchdog_ms=100.0)
    assert _stragglers(_with_host_noise(dict(job.dumps), mean_ms, seed=1)) == ("healthy", [])


@pytest.mark.parametrize("seed", [1, 3])
def test_hosts_that_arrive_apart_at_random_make_no_straggler_of_a_rank_with_few_samples(seed):
    """An interleaved pipeline's dumps hold few collectives per rank: with random arrivals
    40 ms apart on average, some rank is late at most of its dozen by chance. That is the
    job's noise, which a straggler must stand out from."""
    job = generate(8, 1, 4, steps=2, timing=True, seed=seed, vchunks=2, coalesced_events="marker", watchdog_ms=100.0)
    assert _stragglers(_with_host_noise(dict(job.dumps), 40.0, seed=seed)) == ("healthy", [])
