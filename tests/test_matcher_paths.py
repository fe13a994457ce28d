"""The matcher's shortcuts must not change what it finds.

Entries are dealt into their groups by the loader's workers (`table/by_group.py`
`deal_by_group`), and one rank may record one group under two names; the
streams built either way must hold the same entries in the rank's own order.
"""

from __future__ import annotations

from collections import Counter

from helpers import write_synth_job

from frtrace.load.layout import build_layout
from frtrace.load.loader import load_dumps
from frtrace.match.analysis import analyze
from frtrace.match.matcher import _rank_streams, match
from frtrace.table.by_group import deal_by_group
from frtrace.table.entry_table import EntryTable
from frtrace.testing.synth import Fault, generate


def _facts(result) -> list:
    return ([(m.group_id, m.seq, tuple(m.calls), m.not_issued, m.completed_ranks, m.disagreement is None)
             for m in result.collectives]
            + [(p.group_id, p.src, p.dst, p.ordinal, p.send is None, p.recv is None) for p in result.p2p])


def test_dealing_while_loading_matches_like_dealing_afterwards(tmp_path):
    job = generate(16, 2, 2, steps=3, timing=True, fault=Fault("p2p_unmatched", rank=3, group="pp", step=2))
    write_synth_job(tmp_path, job)
    during = analyze([tmp_path], workers=2)
    loaded = load_dumps([tmp_path], workers=1)
    layout = build_layout(loaded.dumps, loaded.failed_ranks, None)
    assert _facts(during.matches) == _facts(match(loaded.dumps, layout))
    assert len(during.matches.p2p) > 0 and len(during.matches.collectives) > 0


class _OneGroupTwoNames:
    """A layout in which names "a" and "b" are one group (id 0)."""

    def group_of(self, pg_name, rank):
        return 0 if pg_name in ("a", "b") else None


def test_a_group_recorded_under_two_names_keeps_the_rank_order(tmp_path):
    job = generate(4, 2, 1, steps=2)
    write_synth_job(tmp_path, job)
    dump = load_dumps([tmp_path], workers=1).dumps[0]
    # One group's entries, alternating between two names, as a rank could record them.
    busiest = Counter(e.pg_name for e in dump.entries).most_common(1)[0][0]
    mine = [e for e in dump.entries if e.pg_name == busiest]
    dump.entries = EntryTable.from_entries([e._replace(pg_name="ab"[i % 2]) for i, e in enumerate(mine)])
    assert len(dump.entries) > 4
    stream = _rank_streams(dump, _OneGroupTwoNames(), deal_by_group(dump.entries))[0]
    collectives = [e for e in dump.entries if not e.name.is_p2p]
    assert [e for batch in stream.collectives.values() for e in batch] == collectives
    assert list(stream.collectives) == list(dict.fromkeys(e.collective_seq_id for e in collectives))
    assert list(stream.p2p) == [e for e in dump.entries if e.name.is_p2p and not e.name.is_coalesced_marker]
