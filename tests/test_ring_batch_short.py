"""A context-parallel rank that leaves out a ring step's batch (its send and its recv) and
goes on. NCCL pairs each channel's ops in order, so its later batches pair with its
neighbours' earlier ones and every batch completes but its neighbours' last: the rank
after it waits for a send it never posts, the rank before it for a recv. Each of those
neighbours' last batches (`batch_isend_irecv`: its ops finish together) holds an op
whose other end finished it and went on, which alone would read as the neighbour's GPU
having stopped; the batch's other op names the rank that posted one batch fewer than
the rank in its place in the sibling ring."""

from __future__ import annotations

import copy

import pytest
from helpers import analyse_dicts

from frtrace.testing.synth import generate

# What PyTorch records: batch end markers, watchdog polls, pipeline bubbles, pg_status by work.
FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}

# The ring [0, 1, 2, 3] runs beside its sibling [4, 5, 6, 7]; the culprit is of the first.
WRAPPED = {0: 7, 1: 4, 2: 10, 3: 5, 4: 6, 5: 3, 6: 8, 7: 2}  # entries each rank's buffer lost


def _unfinished(entry: dict) -> None:
    entry.update(state="started", retired=False, time_discovered_completed_ns=None, duration_ms=None)


def _ring_step_left_out(culprit: int = 3, batches_numbered_as_collectives: bool = True) -> dict:
    """8 ranks (CP 4 x DP 2: rings [0-3] and [4-7], DP pairs [r, r+4]), batched ring
    steps, then a DP batch, an all_gather and a job-wide all_reduce; whole dumps with
    timing, ring buffers that wrapped at their own points. `culprit` posted one ring
    batch fewer. Its two neighbours wait in their last batch, their DP partners in the DP
    batch for them; the other ranks went on to the job-wide all_reduce."""
    dumps = copy.deepcopy(dict(generate(8, tp=1, pp=4, steps=2, ring=True, p2p="batched", timing=True, seed=1,
                                        **FAITHFUL).dumps))

    def ring_ops(rank: int) -> list:
        return [e for e in dumps[rank]["entries"] if e["process_group"][1] == "cp"]

    for rank in range(8 if batches_numbered_as_collectives else 0):
        for e in ring_ops(rank):  # torch numbers each batch as a collective too (startCoalescing)
            e["collective_seq_id"] = e["p2p_seq_id"]
    # The culprit leaves out a ring step three from the end: its later batches take one number
    # less (each rank numbers its own batches) and, in NCCL's order, pair with its
    # neighbours' batches of the step before (whose tensors alternate in size).
    left_out = ring_ops(culprit)[-1]["p2p_seq_id"] - 3
    kept = [e for e in dumps[culprit]["entries"] if not (e["process_group"][1] == "cp" and e["p2p_seq_id"] == left_out)]
    first_id = kept[0]["record_id"]
    for record_id, e in enumerate(kept, start=first_id):  # it recorded nothing for the step
        e["record_id"] = record_id
        if e["process_group"][1] == "cp" and e["p2p_seq_id"] > left_out:
            e["p2p_seq_id"] -= 1
            e["collective_seq_id"] -= batches_numbered_as_collectives
    dumps[culprit]["entries"] = kept
    neighbours = ((culprit - 1) % 4, (culprit + 1) % 4)
    for rank in range(8):
        entries = dumps[rank]["entries"]
        if rank in neighbours:  # in their last ring batch
            cut = max(i for i, e in enumerate(entries) if e["process_group"][1] == "cp") + 1
        elif rank - 4 in neighbours:  # in the DP batch, for the neighbours
            cut = max(i for i, e in enumerate(entries) if e["process_group"][1] == "dp"
                      and e["collective_seq_id"] == entries[-3]["collective_seq_id"]) + 1
        else:  # in the job-wide all_reduce
            cut = len(entries)
        # Ring buffers that wrapped, each at its own point (the channels' finished ops then
        # pair from the newest back).
        dumps[rank]["entries"] = entries[WRAPPED[rank]:cut]
        _unfinished(dumps[rank]["entries"][-1])
        dumps[rank]["pg_status"] = _status_of(dumps[rank]["entries"])
    return dumps


def _status_of(entries: list) -> dict:
    """pg_status as torch keeps it, read off the entries: per group, the number of its
    last work enqueued, started and completed (a batch is one work, its end marker; a P2P
    work counts by its P2P number)."""
    markers = {(e["pg_id"], e["collective_seq_id"], e["p2p_seq_id"]) for e in entries
               if e["profiling_name"].endswith("coalesced")}
    status: dict = {}
    for e in entries:
        key = (e["pg_id"], e["collective_seq_id"], e["p2p_seq_id"])
        marker = e["profiling_name"].endswith("coalesced")
        if key in markers and not marker:
            continue  # an op of a batch: its marker is the work
        p2p = e["is_p2p"] or (marker and any(o["is_p2p"] and (o["pg_id"], o["collective_seq_id"], o["p2p_seq_id"]) == key
                                             for o in entries))
        number = e["p2p_seq_id"] if p2p else e["collective_seq_id"]
        row = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                  "last_completed_collective": -1})
        row["last_enqueued_collective"] = number
        if e["state"] in ("started", "completed"):
            row["last_started_collective"] = number
        if e["state"] == "completed":
            row["last_completed_collective"] = number
    return status


@pytest.mark.parametrize("numbered_as_collectives", [True, False], ids=["torch-numbering", "p2p-numbering"])
@pytest.mark.parametrize("culprit", [3, 0])
def test_a_ring_rank_that_left_out_a_batch_is_named_not_its_neighbours(numbered_as_collectives, culprit):
    _, diagnosis = analyse_dicts(_ring_step_left_out(culprit, numbered_as_collectives), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (culprit,))
