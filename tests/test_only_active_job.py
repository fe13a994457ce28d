"""A job dumped with only active entries (`onlyActive`) is one setting for every rank.

A batch's ops (batch_isend_irecv) are recorded without events, so they never look
finished, and only-active dumps leave out their finished marker: the loader settles them
where a dump shows gaps in its record ids. A rank whose only unfinished entries are one
batch's ops shows no gap, yet its dump was taken the same way: read alone it looks as if
that batch never finished, and its partner, whose batch was settled, as if it never
posted the other end."""

from __future__ import annotations

import json

import pytest
from helpers import analyse_dicts, run_cli, write_job

from frtrace.testing.synth import generate


def _only_active(job) -> dict:
    """The dumps as onlyActive writes them: every entry with a discovered completion left out."""
    return {rank: dict(dump, entries=[e for e in dump["entries"] if e.get("time_discovered_completed_ns") is None])
            for rank, dump in job.dumps.items()}


def _gapless(entries: list) -> bool:
    return bool(entries) and entries[-1]["record_id"] - entries[0]["record_id"] + 1 == len(entries)


def _only_its_newest_batch(dump: dict) -> dict:
    """The dump of a rank whose only unfinished entries are its newest P2P batch's ops."""
    entries = dump["entries"]
    newest = [e for e in entries if e["is_p2p"]][-1]
    batch = [e for e in entries if e["is_p2p"] and e["process_group"] == newest["process_group"]
             and e["p2p_seq_id"] == newest["p2p_seq_id"]]
    return dict(dump, entries=batch)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_whose_only_active_entries_are_one_batch_is_read_as_the_rest_of_the_job(seed):
    job = generate(16, 2, 2, steps=3, p2p="batched", coalesced_events="marker", pg_status="work", watchdog_ms=100.0,
                   seed=seed)
    assert job.truth["status"] == "healthy"
    dumps = _only_active(job)
    rank = next(r for r, d in sorted(dumps.items()) if any(e["is_p2p"] for e in d["entries"]))
    dumps[rank] = _only_its_newest_batch(dumps[rank])
    assert _gapless(dumps[rank]["entries"]) and len(dumps[rank]["entries"]) >= 1
    assert not all(_gapless(d["entries"]) for d in dumps.values())  # the others show the setting
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("healthy", ())


def test_the_command_reads_such_a_job_from_files_as_healthy(tmp_path):
    job = generate(16, 2, 2, steps=3, p2p="batched", coalesced_events="marker", pg_status="work", watchdog_ms=100.0,
                   seed=1)
    dumps = _only_active(job)
    rank = next(r for r, d in sorted(dumps.items()) if any(e["is_p2p"] for e in d["entries"]))
    dumps[rank] = _only_its_newest_batch(dumps[rank])
    write_job(tmp_path, dumps, prefix="nccl_trace_rank_")
    result = run_cli([tmp_path, "--format", "json", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "healthy"
