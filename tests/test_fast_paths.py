"""Every fast path of the table and the matcher answers what its plain twin answers
(frtrace.testing.twins, the rule in ARCHITECTURE.md): the matcher settles most
collectives at a glance where its twin judges each one, reads each rank's keys per
number in C where its twin looks each number up, and so on. Run over both, the match
must agree in every field of every collective and P2P pair, and the report in every
byte, on realistic jobs (wrapped buffers, batches, missing dumps, hangs and mismatches)."""

from __future__ import annotations

import pytest
from helpers import write_synth_job

from frtrace.diagnosis import diagnose
from frtrace.load.layout import build_layout
from frtrace.load.loader import load_dumps
from frtrace.match.analysis import finish_analysis
from frtrace.match.matcher import match
from frtrace.report.render import render_json
from frtrace.testing.synth import Fault, generate
from frtrace.testing.twins import LOADING_MODULES, MODULES, fast_paths, plain_twins

JOBS = [
    (Fault("hang", rank=3, group="dp", step=1), {"p2p": "mixed"}),
    (Fault("missing_dump_hang", rank=5, group="tp", step=1), {"buffer_size": 150}),
    (Fault("skip_op", rank=7, group="tp", step=1), {"p2p": "batched", "coalesced_events": "marker"}),
    (Fault("extra_op", rank=2, group="dp", step=1), {"buffer_size": 120, "coalesced_events": "marker"}),
    (Fault("op_mismatch", rank=6, group="dp", step=2), {"buffer_size": 90, "pg_status": "work"}),
    (Fault("stuck", rank=5, group="pp", step=1), {"p2p": "mixed", "buffer_size": 200}),
    (Fault("straggler", rank=4, group="tp", step=1), {"timing": True}),
    (None, {"coalesced_events": "marker", "pg_status": "work"}),
]


def _every_field(result) -> list:
    return ([(m.group_id, m.seq, list(m.calls), m.not_issued, m.out_of_window, m.no_dump, m.unfinished,
              m.disagreement, m.completed_ranks, m.finished_unseen, m.issued) for m in result.collectives]
            + [(p.group_id, p.src, p.dst, p.ordinal, p.send, p.recv) for p in result.p2p])


def _loaded(tmp_path, fault, options):
    write_synth_job(tmp_path, generate(16, 2, 2, steps=3, fault=fault, seed=5, **options))
    loaded = load_dumps([tmp_path], workers=1)
    return loaded, build_layout(loaded.dumps, loaded.failed_ranks, None)


def _match_and_report(loaded, layout) -> tuple[list, str]:
    matches = match(loaded.dumps, layout)
    analysis = finish_analysis(loaded, layout, matches)
    return _every_field(matches) + _every_field(analysis.device), render_json(analysis, diagnose(analysis))


@pytest.mark.parametrize("fault, options", JOBS)
def test_the_fast_paths_find_what_their_plain_twins_find(tmp_path, fault, options):
    loaded, layout = _loaded(tmp_path, fault, options)
    fast = _match_and_report(loaded, layout)
    # The shortcut was taken: most collectives were settled, every rank having completed them.
    result = match(loaded.dumps, layout)
    settled = [m for m in result.collectives if m.completed_ranks == m.issued == tuple(result.views[m.group_id].streams)]
    assert len(settled) > len(result.collectives) / 2
    with plain_twins():
        plain = _match_and_report(loaded, layout)
    assert fast == plain


@pytest.mark.parametrize("path", sorted(fast_paths(MODULES)))
def test_each_plain_twin_alone_finds_what_the_fast_path_finds(tmp_path, path):
    loaded, layout = _loaded(tmp_path, Fault("skip_op", rank=7, group="tp", step=1),
                             {"p2p": "batched", "coalesced_events": "marker", "buffer_size": 150})
    fast = _match_and_report(loaded, layout)
    with plain_twins([path]):
        plain = _match_and_report(loaded, layout)
    assert fast == plain


# The loader's fast paths: they build each rank's table, which the tests above read.
LOADING_PATHS = sorted(fast_paths(LOADING_MODULES))


@pytest.mark.parametrize("path", LOADING_PATHS)
@pytest.mark.parametrize("fault, options", JOBS)
def test_the_loaders_fast_paths_read_what_their_plain_twins_read(tmp_path, path, fault, options):
    write_synth_job(tmp_path, generate(16, 2, 2, steps=3, fault=fault, seed=5, **options))
    fast = load_dumps([tmp_path], workers=1)
    with plain_twins([path]):
        plain = load_dumps([tmp_path], workers=1)
    assert [(d.rank, d.warnings, d.pg_config, tuple(d.entries)) for d in fast.dumps] == \
        [(d.rank, d.warnings, d.pg_config, tuple(d.entries)) for d in plain.dumps]
    assert len(fast.dumps) >= 15


def test_plain_twins_swap_in_and_back():
    from frtrace.match import matcher
    from frtrace.table.seq_map import SeqMap

    fast_unsettled, fast_keys_at = matcher._unsettled, SeqMap.keys_at
    with plain_twins():
        assert matcher._unsettled is matcher._every_collective and SeqMap.keys_at is SeqMap.keys_at_plain
    assert matcher._unsettled is fast_unsettled and SeqMap.keys_at is fast_keys_at


def test_p2p_names_read_off_the_table_are_the_entries_names(tmp_path):
    """The turns check (diagnosis/own_past.turns_say_skipped) reads a rank's P2P op names
    newest first off the table (`RowList.names_newest_first`); its twin builds each entry.
    Over every rank and group of a pipeline job with plain and batched sends, both give
    the same (position, name) sequence, and it is the entries' own, newest first."""
    loaded, layout = _loaded(tmp_path, Fault("p2p_unmatched", rank=5, group="pp", step=1), {"p2p": "mixed"})
    streams = [stream for view in match(loaded.dumps, layout).views for stream in view.streams.values()]
    p2p_lists = [stream.p2p for stream in streams if len(stream.p2p)]
    assert len(p2p_lists) >= 16
    for p2p in p2p_lists:
        fast = list(p2p.names_newest_first())
        assert fast == list(p2p.names_newest_first_plain())
        assert fast == [(k, p2p[k].name) for k in reversed(range(len(p2p)))]
