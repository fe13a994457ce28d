"""The diagnosis's shortcuts answer what the plain reading of the entries answers:
program order's tokens, batch bounds and P2P lookups read off the columns, and the
newest finished collective per rank found newest first. Checked on synthetic jobs with
batches, coalesced markers, wrapped buffers and queued ops left out of the device view
(rows that are no longer at their entry's own index)."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts, job

from frtrace.diagnosis.frontier import _newest_finished
from frtrace.diagnosis.own_past import channel_positions, past_says_skipped
from frtrace.diagnosis.program import Programs, form_of, newest_p2p_names, p2p_channel, p2p_seq_ids
from frtrace.diagnosis.program_order import ProgramOrder
from frtrace.match.matcher import batch_signature
from frtrace.table.standing import batch_key
from frtrace.testing.synth import Fault, generate

JOBS = {
    "tp_hang_lookahead": dict(world_size=16, tp=2, pp=2, steps=4, timing=True, lookahead=3,
                              fault=Fault("hang", rank=5, group="tp", step=2)),
    "batched_p2p": dict(world_size=16, tp=2, pp=4, steps=3, timing=True, p2p="batched",
                        fault=Fault("p2p_unmatched", rank=6, group="pp", step=1)),
    "markers_mixed_p2p": dict(world_size=8, tp=2, pp=2, steps=4, timing=True, coalesced_events="marker",
                              p2p="mixed", fault=Fault("hang", rank=2, group="dp", step=1)),
    "wrapped": dict(world_size=8, tp=2, pp=2, steps=8, timing=True, buffer_size=25, lookahead=3,
                    fault=Fault("hang", rank=3, group="dp", step=5)),
}


def _records_out_of_file_order() -> dict:
    """A pipeline whose ranks list their entries out of record order: sorted by record id,
    no entry stays at its own index (the row `position` looks at first)."""
    dumps = job({0: ["send 0->1", "all_reduce", "send 0->1", "send 0->1", "all_reduce"],
                 1: ["recv 1<-0", "all_reduce", "recv 1<-0", "recv 1<-0", "all_reduce"]})
    for dump in dumps.values():
        for record, record_id in zip(dump["entries"], [3, 0, 4, 1, 2]):
            record["record_id"] = record_id
    return dumps


@pytest.fixture(scope="module", params=sorted(JOBS) + ["records_out_of_file_order"])
def analysis(request):
    dumps = _records_out_of_file_order() if request.param not in JOBS else dict(generate(**JOBS[request.param]).dumps)
    analysis, _ = analyse_dicts(dumps, render=False)
    return analysis


def _bounds_by_entries(entries, position: int) -> tuple:
    key = batch_key(entries[position])
    start = end = position
    while start > 0 and batch_key(entries[start - 1]) == key:
        start -= 1
    while end + 1 < len(entries) and batch_key(entries[end + 1]) == key:
        end += 1
    return start, end


def _token_by_entries(order: Programs, rank: int, position: int):
    """A token as the entries say it (what Programs.token reads off the columns)."""
    entries = list(order.entries[rank])
    start, end = _bounds_by_entries(entries, position)
    entry = entries[start]
    gid = order.layout.group_of(entry.pg_name, rank)
    if gid is None or gid not in order.family:
        return None
    name = entry.name
    seq = entry.p2p_seq_id if name.is_p2p else entry.collective_seq_id
    return (order.family[gid], name.is_p2p, seq, name.op, name.local_src, name.local_dst,
            batch_signature(entries[start:end + 1]))


def test_tokens_and_batch_bounds_read_off_the_columns_are_the_entries(analysis):
    order = Programs(analysis.device_dumps, analysis.layout, analysis.device)
    assert order.entries
    for rank, table in order.entries.items():
        entries = list(table)
        for position in range(len(entries)):
            assert order.batch_bounds(rank, position) == _bounds_by_entries(entries, position)
            assert order.token(rank, position) == _token_by_entries(order, rank, position)


def test_p2p_reads_and_rows_placed_off_the_columns_are_the_entries(analysis):
    order = Programs(analysis.device_dumps, analysis.layout, analysis.device)
    for view in analysis.device.views:
        for rank, stream in view.streams.items():
            p2p = stream.p2p
            entries = list(p2p)
            assert p2p_seq_ids(p2p) == [e.p2p_seq_id for e in entries]
            newest_first = [(k, entries[k].name) for k in reversed(range(len(entries)))]
            assert list(newest_p2p_names(p2p)) == newest_first
            assert [p2p_channel(e) for e in entries] == [(n.op, n.local_src, n.local_dst) for _, n in newest_first[::-1]]
            if rank in order.entries:
                assert ([order.p2p_position(rank, p2p, k) for k in range(len(entries))]
                        == [order.position(rank, e) for e in entries])
                collectives = stream.collectives
                rows = collectives._rows  # every row, a batch's too
                assert ([order.row_position(rank, collectives.table, row) for row in rows]
                        == [order.position(rank, collectives.table[row]) for row in rows])


def test_newest_finished_read_newest_first_is_the_last_completed(analysis):
    full = analysis.matches
    for view in full.views:
        matches = full.index.collectives_of.get(view.group.id, [])
        expected: dict = {}
        for match in matches:
            for rank in match.completed_ranks:
                expected[rank] = match.seq
        for rank, stream in view.streams.items():
            if stream.finished is not None:
                expected[rank] = max(expected.get(rank, -1), stream.finished)
        assert _newest_finished(view, matches) == expected


@pytest.mark.parametrize("max_witnesses", [3, 64])
def test_what_program_order_keeps_answers_as_a_fresh_one(monkeypatch, max_witnesses):
    """Findings asked one after another of one ProgramOrder (its tokens, batch bounds and
    sibling witnesses kept) are judged as by a ProgramOrder of their own; with few
    witnesses, findings of the family's first groups and of the others read apart."""
    from frtrace.diagnosis import like_ranks, program_order

    monkeypatch.setattr(like_ranks, "MAX_WITNESSES", max_witnesses)
    # A send left out in one pipeline: the other pipelines posted it (the root finding has
    # witnesses), and every pipeline's channels wait behind it (findings without).
    dumps = dict(generate(world_size=32, tp=2, pp=4, steps=4, timing=True, p2p="batched",
                          fault=Fault("p2p_unmatched", rank=5, group="pp", step=2)).dumps)
    analysis, diagnosis = analyse_dicts(dumps, render=False)
    findings = [f for f in diagnosis.findings if f.kind in ("p2p_unmatched", "not_issued")]
    assert sum(f.kind == "p2p_unmatched" for f in findings) > 3  # one per pipeline channel, 8 pipelines
    witnessed = 0

    def fresh() -> ProgramOrder:
        return ProgramOrder(analysis.device_dumps, analysis.layout, analysis.device)

    shared = fresh()
    for finding in findings + findings[::-1]:
        ranks = tuple(sorted(set(finding.absent_ranks) | set(finding.waiting_ranks)))
        assert (program_order.went_past_finding(shared, finding, ranks)
                == program_order.went_past_finding(fresh(), finding, ranks))
        if finding.kind != "p2p_unmatched":  # the rank's collectives of the group before the op, placed
            for rank in ranks:
                program = shared.program
                stream = program.views[finding.group_id].streams.get(rank)
                placed = [program.position(rank, stream.collectives[s][0]) for s in sorted(stream.collectives)
                          if s < finding.collective_seq_id] if stream and rank in program.entries else []
                assert channel_positions(program, finding, rank) == [p for p in placed if p is not None]
        if finding.kind == "p2p_unmatched":
            witnesses = like_ranks.p2p_witnesses(shared.program, shared.siblings, finding)
            other = fresh()
            assert witnesses == like_ranks.p2p_witnesses(other.program, other.siblings, finding)
            witnessed += bool(witnesses[1])
    assert witnessed >= 1


def test_the_unfinished_collectives_are_those_some_issuer_did_not_complete(analysis):
    """The rules that look for where a group stands read only the matches the matcher
    marks unfinished: exactly those some rank that issued them has not completed."""
    from frtrace.diagnosis.facts import unfinished

    for result in (analysis.matches, analysis.device):
        for view in result.views:
            matches = result.index.collectives_of.get(view.group.id, [])
            expected = [m for m in matches if len(m.completed_ranks) < len(m.calls)]
            assert list(unfinished(matches)) == expected

def _forms_by_tokens(order: Programs, rank: int, start, stop: int, limit: int) -> tuple:
    """Programs.forms_from as the tokens say it: token by token, batch after batch."""
    forms: list = []
    while start is not None and start < stop and len(forms) < limit:
        token = order.token(rank, start)
        if token is None:
            return forms, False
        forms.append(token.form)
        start = order.following(rank, start)
    return forms, start is None or start >= stop


def test_forms_walked_off_the_columns_are_the_tokens_forms(analysis):
    """The walk through a rank's past reads each op's batch key once and no token; it
    gives the forms of the tokens, batch by batch, from inside a batch too, cut where
    the tokens' walk is cut (at `stop`, at `limit`, at an op outside every group)."""
    order = Programs(analysis.device_dumps, analysis.layout, analysis.device)
    walked = 0
    for rank, table in order.entries.items():
        length = len(table)
        for start in list(range(length)) + [None]:
            for stop, limit in [(length, 256), (length, 3), (length, 1), (length, 0),
                                ((start or 0) + 5, 256), ((start or 0) + 1, 2), (start or 0, 4)]:
                fresh = Programs(analysis.device_dumps, analysis.layout, analysis.device)
                assert order.forms_from(rank, start, stop, limit) == _forms_by_tokens(fresh, rank, start, stop, limit)
                walked += 1
    assert walked > 50


def _past_says_skipped_by_tokens(order: Programs, rank: int, channel: list, op_form):
    """past_says_skipped as it reads with every stretch walked whole, token by
    token (no early stop at the first op unlike the stretch it is compared with)."""
    from frtrace.diagnosis.own_past import HISTORY_SPAN, HISTORY_TRIES

    if len(channel) < 2:
        return None
    start = order.following(rank, channel[-1])
    if start is None:
        return None
    end = len(order.entries[rank])
    now, whole = _forms_by_tokens(order, rank, start, end, HISTORY_SPAN)
    tries = 0
    for j in range(len(channel) - 1, 0, -1):
        if tries == HISTORY_TRIES:
            break
        if op_form is not None and form_of(order.token(rank, channel[j])) != op_form:
            continue
        tries += 1
        before, complete = _forms_by_tokens(order, rank, order.following(rank, channel[j - 1]), channel[j], HISTORY_SPAN)
        if not (whole and complete) or not before or now[:len(before)] != before[:len(now)]:
            continue
        if len(now) <= len(before):
            return None
        after, _ = _forms_by_tokens(order, rank, order.following(rank, channel[j]), end, len(now) - len(before))
        if now[len(before):] == after:
            return order.went_past(rank, order.nth_following(rank, start, len(before)), 0, True)
    return None


PAST_JOBS = {
    "own_past": dict(world_size=8, tp=1, pp=8, steps=4, fault=Fault("skip_op", rank=3, group="default", step=2)),
    "steps_differ": dict(world_size=8, tp=1, pp=4, steps=4, fault=Fault("skip_op", rank=0, group="default", step=2)),
    "first_stage_skips_send": dict(world_size=8, tp=1, pp=8, steps=4, fault=Fault("p2p_unmatched", rank=0, group="pp", step=2)),
    "pipeline_hang": dict(world_size=16, tp=2, pp=4, steps=4, timing=True, fault=Fault("hang", rank=5, group="tp", step=2)),
    "batched_p2p": JOBS["batched_p2p"],
    "wrapped": JOBS["wrapped"],
}


def test_a_ranks_past_read_with_early_stops_says_what_the_whole_stretches_say():
    """past_says_skipped, which stops reading a stretch of the rank's past at its first op
    unlike what the rank did since (and reads nothing more when that is unfinished), says
    what reading every stretch whole says: for every rank, on each of its groups'
    collective channels (every prefix, with and without the op's form) and P2P channels."""
    from frtrace.diagnosis.program import name_channel

    said = asked = 0
    for name, params in PAST_JOBS.items():
        analysis, _ = analyse_dicts(dict(generate(**params).dumps), render=False)
        order = Programs(analysis.device_dumps, analysis.layout, analysis.device)
        reference = Programs(analysis.device_dumps, analysis.layout, analysis.device)
        for view in analysis.device.views:
            for rank, stream in view.streams.items():
                if rank not in order.entries:
                    continue
                channels = []
                positions = [order.position(rank, stream.collectives[s][0]) for s in sorted(stream.collectives)]
                positions = [p for p in positions if p is not None]
                for k in range(2, len(positions) + 1):
                    channels.append((positions[:k], None))
                    channels.append((positions[:k], form_of(order.token(rank, positions[k - 1]))))
                by_channel: dict = {}
                for k, entry in enumerate(stream.p2p):
                    position = order.p2p_position(rank, stream.p2p, k)
                    if position is not None:
                        by_channel.setdefault(name_channel(entry.name), []).append(position)
                channels += [(positions, None) for positions in by_channel.values()]
                for channel, op_form in channels:
                    expected = _past_says_skipped_by_tokens(reference, rank, channel, op_form)
                    assert past_says_skipped(order, rank, channel, op_form) == expected, (name, rank, channel)
                    asked += 1
                    said += expected is not None
    assert asked > 1000 and said > 0
