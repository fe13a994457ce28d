"""The matcher settles most collectives at a glance: it takes the numbers the ranks
hold as a range when each rank holds a run of them, reads each rank's keys per number
through a layout its peers share, and builds the matches of settled collectives a run
at a time. What it finds must be exactly what judging every collective one by one, over
the plain union of the numbers, finds: every field of every match, on realistic jobs
(wrapped buffers, batches, missing dumps, hangs and mismatches)."""

from __future__ import annotations

import pytest
from helpers import write_synth_job

from frtrace.load.layout import build_layout
from frtrace.load.loader import load_dumps
from frtrace.match import matcher
from frtrace.match.matcher import match
from frtrace.testing.synth import Fault, generate


def _every_field(result) -> list:
    return [(m.group_id, m.seq, list(m.calls), m.not_issued, m.out_of_window, m.no_dump, m.unfinished,
             m.disagreement, m.completed_ranks, m.finished_unseen, m.issued)
            for m in result.collectives]


def _judged_one_by_one(monkeypatch) -> None:
    """Make the matcher judge every collective, over the union of the ranks' numbers."""
    monkeypatch.setattr(matcher, "_unsettled", lambda columns: set(range(len(columns[0]))))
    monkeypatch.setattr(matcher, "_numbers_held", lambda tables: sorted(set().union(*tables)))


@pytest.mark.parametrize("fault, options", [
    (Fault("hang", rank=3, group="dp", step=1), {"p2p": "mixed"}),
    (Fault("missing_dump_hang", rank=5, group="tp", step=1), {"buffer_size": 150}),
    (Fault("skip_op", rank=7, group="tp", step=1), {"p2p": "batched", "coalesced_events": "marker"}),
    (Fault("extra_op", rank=2, group="dp", step=1), {"buffer_size": 120, "coalesced_events": "marker"}),
    (Fault("op_mismatch", rank=6, group="dp", step=2), {"buffer_size": 90, "pg_status": "work"}),
    (Fault("stuck", rank=5, group="pp", step=1), {"p2p": "mixed", "buffer_size": 200}),
    (None, {"coalesced_events": "marker", "pg_status": "work"}),
])
def test_settling_at_a_glance_finds_what_judging_each_collective_finds(tmp_path, monkeypatch, fault, options):
    write_synth_job(tmp_path, generate(16, 2, 2, steps=3, fault=fault, seed=5, **options))
    loaded = load_dumps([tmp_path], workers=1)
    layout = build_layout(loaded.dumps, loaded.failed_ranks, None)
    fast = match(loaded.dumps, layout)
    # The shortcut was taken: most collectives were settled, every rank having completed them.
    settled = [m for m in fast.collectives if m.completed_ranks == m.issued == tuple(fast.views[m.group_id].streams)]
    assert len(settled) > len(fast.collectives) / 2
    with monkeypatch.context() as patched:
        _judged_one_by_one(patched)
        slow = match(loaded.dumps, layout)
    assert _every_field(fast) == _every_field(slow)


def test_numbers_held_is_the_union_of_the_ranks_numbers():
    """A range only when no number between the lowest and highest is missing."""
    class Held(list):
        """Numbers one rank holds, as `_numbers_held` reads a SeqMap."""

        @property
        def seqs(self):
            return self

        @property
        def dense(self):
            return not self or len(set(self)) == self[-1] - self[0] + 1

    for ranks in ([[1, 2, 3], [2, 3, 4, 5]], [[1, 2], [4, 5]], [[1, 2], [3, 4], []], [[1, 1, 2], [3]],
                  [[1, 3], [2]], [[], []], [[5, 6], [1, 2, 3, 4]]):
        tables = [Held(numbers) for numbers in ranks]
        assert list(matcher._numbers_held(tables)) == sorted(set().union(*ranks))
