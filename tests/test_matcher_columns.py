"""The matcher judges the collectives it cannot settle at a glance, and pairs P2P ops,
from the columns of each rank's EntryTable, without building an Entry per op: what it
finds must be exactly what reading the Entry tuples finds.

The oracle here is that entry-by-entry reading, as the matcher did it before (every
rank's entries at a collective surveyed and compared with `find_disagreement`; every
P2P op of a channel read as an Entry, sorted, split and paired). Hypothesis generates
groups whose ranks issue different ops, sizes, dtypes, unreadable ops, coalesced
batches and every way of saying an op completed (state, retired, time_completed_ns),
and P2P channels with batches, `recv ?`, ops out of order and wrapped ring buffers;
synthetic jobs of each fault check the same on realistic dumps.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from itertools import repeat

import pytest
from helpers import write_synth_job
from hypothesis import given, settings
from hypothesis import strategies as st

from frtrace.load.layout import build_layout
from frtrace.load.loader import load_dumps
from frtrace.match.matcher import GroupView, MatchResult, _channel_ends, find_disagreement, match
from frtrace.model import UNREADABLE_OP, Entry, Group, OpName, Shapes
from frtrace.table.rank_dump import RankDump
from frtrace.testing.synth import Fault, generate

# --------------------------------------------------------------------------- building dumps

_ALL_REDUCE = OpName("nccl:all_reduce", "nccl", "all_reduce", False)
_ALL_TO_ALL = OpName("nccl:all_to_all_single", "nccl", "all_to_all_single", False)
_GATHER = OpName("nccl:gather", "nccl", "gather", False)
_MARKER = OpName("nccl:coalesced", "nccl", "coalesced", False, None, None, True)
_P2P_MARKER = OpName("nccl:coalesced", "nccl", "coalesced", True, None, None, True)
_OPS = [_ALL_REDUCE, _ALL_TO_ALL, _GATHER, UNREADABLE_OP]
_SHAPES = [
    Shapes(((4,),), ("Float",), ((4,),), ("Float",)),
    Shapes(((8,),), ("Float",), ((8,),), ("Float",)),
    Shapes(((4,),), ("Half",), ((4,),), ("Half",)),
    Shapes(((2, 2),), ("Float",), ((2, 2),), ("Float",)),  # as many elements as the first
    Shapes((), (), (), (), False),
    Shapes(((4,),), ("Float",), ((4,),), ("Float",)),  # equal to the first, another object
]
# (state, retired, time_completed_ns): every way an entry says, or does not say, it completed.
_DONE = st.tuples(st.sampled_from(["completed", "started", "scheduled"]), st.sampled_from([None, False, True]),
                  st.sampled_from([None, 0, 1_700_000_000_000]))


class _OneGroup:
    """The layout of a job with one group, "0", of `ranks`."""

    def __init__(self, ranks: tuple) -> None:
        self.groups = (Group(0, "0", "pg", ranks, len(ranks), "pg_config"),)

    def group_of(self, pg_name: str, rank: int):
        return 0 if pg_name == "0" else None


def _entry(index: int, seq: int, name: OpName, shapes: Shapes, done: tuple, *, p2p_seq: int = 0, op_id: int = 0,
           first_record: int = 0) -> Entry:
    state, retired, completed_ns = done
    return Entry(index, first_record + index, "0", "pg", 0, seq, p2p_seq, op_id, name, shapes, state, retired,
                 1_600_000_000_000 + index, None, completed_ns, None, 600000, ())


def _dump(rank: int, entries: list) -> RankDump:
    return RankDump(rank, f"rank_{rank}", "pickle", "2.10", "", (), {}, entries, True)


# --------------------------------------------------------------------------- the oracle: entry by entry


def _kinds(batch: tuple) -> tuple:
    return tuple((entry.name, entry.shapes) for entry in batch)


def _judged_by_entries(calls: dict) -> tuple:
    """(issued, completed ranks, disagreement) of a collective from its entries."""
    alike = all(_kinds(batch) == _kinds(next(iter(calls.values()))) for batch in calls.values())
    completed = tuple(sorted(rank for rank, batch in calls.items() if all(e.completed for e in batch)))
    return tuple(sorted(calls)), completed, find_disagreement(calls, None, alike)


def _paired_by_entries(view: GroupView) -> list:
    """(src, dst, ordinal, send, recv) of each pair of a group, read as Entry tuples; an
    end is (id of its table, row), None when it was never posted."""
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    any_source: dict = defaultdict(list)
    where: dict = {}
    for rank, stream in view.streams.items():
        if not stream.p2p:
            continue
        ops = list(stream.p2p)
        rows = [stream.p2p.row(k) for k in range(len(stream.p2p))]
        where.update(zip(map(id, ops), zip(repeat(id(stream.p2p.table)), rows)))
        for op in ops:
            ends = _channel_ends(view.group.ranks, rank, op.name)
            if ends is None or (op.op == "send" and ends[1] is None):
                continue
            if op.op == "send":
                sends[ends].append(op)
            elif ends[0] is not None:
                recvs[ends].append(op)
            else:
                any_source[ends[1]].append(op)

    def in_order(ops: list) -> list:
        return sorted(ops, key=operator.attrgetter("p2p_seq_id", "op_id", "record_id"))

    def by_batching(ops: list, rank: int) -> tuple:
        batched = view.streams[rank].batched if rank in view.streams else frozenset()
        return [o for o in ops if o.p2p_seq_id not in batched], [o for o in ops if o.p2p_seq_id in batched]

    def pair_by_completion(sends: list, recvs: list) -> list:
        done_sends, done_recvs = [o for o in sends if o.completed], [o for o in recvs if o.completed]
        left_sends, left_recvs = [o for o in sends if not o.completed], [o for o in recvs if not o.completed]
        older = len(done_sends) - len(done_recvs)
        pairs = [(s, None) for s in done_sends[:max(older, 0)]] + [(None, r) for r in done_recvs[:max(-older, 0)]]
        pairs += zip(done_sends[max(older, 0):], done_recvs[max(-older, 0):])
        pairs += zip(left_sends, left_recvs)
        return pairs + [(s, None) for s in left_sends[len(left_recvs):]] + [(None, r) for r in left_recvs[len(left_sends):]]

    def pair_in_order(sends: list, recvs: list) -> list:
        count = max(len(sends), len(recvs))
        return list(zip(sends + [None] * (count - len(sends)), recvs + [None] * (count - len(recvs))))

    def at(op):
        return None if op is None else where[id(op)]

    pairs_found = []
    for src, dst in sorted(set(sends) | set(recvs)):
        plain_sends, batched_sends = by_batching(in_order(sends.get((src, dst), [])), src)
        plain_recvs, batched_recvs = by_batching(in_order(recvs.get((src, dst), [])), dst)
        spare = any_source.get(dst)
        if spare and len(plain_recvs) < len(plain_sends):
            taken = min(len(spare), len(plain_sends) - len(plain_recvs))
            plain_recvs = plain_recvs + spare[:taken]
            del spare[:taken]
        # Both ends hold the channel's whole history (RankStream.p2p_whole: no buffer wrapped, or
        # an only-active dump that keeps every batch's ops), or it pairs by completion.
        clipped = any(rank in view.streams and not view.streams[rank].p2p_whole for rank in (src, dst))
        pair = pair_by_completion if clipped else pair_in_order
        pairs = pair(plain_sends, plain_recvs) + pair(batched_sends, batched_recvs)
        pairs_found += [(src, dst, k, at(s), at(r)) for k, (s, r) in enumerate(pairs)]
    for dst, leftovers in sorted(any_source.items()):
        pairs_found += [(-1, dst, k, None, at(r)) for k, r in enumerate(leftovers)]
    return pairs_found


def _pairs(result: MatchResult, group_id: int) -> list:
    """(src, dst, ordinal, send, recv) of the matcher's pairs of a group (see _paired_by_entries)."""
    return [(p.src, p.dst, p.ordinal, None if p.send_table is None else (id(p.send_table), p.send_row),
             None if p.recv_table is None else (id(p.recv_table), p.recv_row))
            for p in result.p2p if p.group_id == group_id]


def _assert_as_by_entries(result: MatchResult) -> None:
    """Every collective and P2P pair of `result` is what reading the entries finds."""
    for match_ in result.collectives:
        streams = result.views[match_.group_id].streams
        calls = {rank: stream.collectives[match_.seq] for rank, stream in streams.items()
                 if match_.seq in stream.collectives}
        assert list(match_.calls) == list(calls) and dict(match_.calls) == calls
        assert (match_.issued, match_.completed_ranks, match_.disagreement) == _judged_by_entries(calls)
    for view in result.views:
        assert _pairs(result, view.group.id) == _paired_by_entries(view)


# --------------------------------------------------------------------------- collectives

# What a rank issued at one sequence number: nothing, one op, or a coalesced batch (ops and a marker).
_op = st.tuples(st.sampled_from(_OPS), st.sampled_from(_SHAPES), _DONE)
_issued = st.one_of(st.none(), _op.map(lambda op: [op]),
                    st.lists(_op, min_size=1, max_size=3).map(lambda ops: ops + [(_MARKER, _SHAPES[0], ops[0][2])]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_issued, min_size=4, max_size=4), min_size=2, max_size=5), st.integers(0, 2))
def test_collectives_are_judged_as_their_entries_say(ranks, first_record):
    dumps = []
    for rank, seqs in enumerate(ranks):
        ops = [(seq, op) for seq, batch in enumerate(seqs) if batch for op in batch]
        dumps.append(_dump(rank, [_entry(i, seq, name, shapes, done, first_record=first_record if rank == 0 else 0)
                                  for i, (seq, (name, shapes, done)) in enumerate(ops)]))
    result = match(dumps, _OneGroup(tuple(range(len(ranks) + 1))))  # the last member left no dump
    _assert_as_by_entries(result)


def test_a_hang_and_an_all_to_all_are_judged_from_their_keys():
    """The cases the shortcut is for: every rank issued the same op and all but one have
    not finished it, and an all_to_all whose sizes differ by rank; plus a rank that
    issued another op, the one disagreement among them."""
    done, waiting, retired = ("completed", True, None), ("scheduled", None, None), ("started", True, None)
    dumps = []
    for rank in range(6):
        entries = [_entry(0, 0, _ALL_TO_ALL, _SHAPES[rank % 2], done),
                   _entry(1, 1, _ALL_REDUCE, _SHAPES[0], waiting if rank else done),
                   _entry(2, 2, _ALL_REDUCE, _SHAPES[0], retired if rank == 3 else done)]
        if rank != 5:
            entries.append(_entry(3, 3, _GATHER if rank == 2 else _ALL_REDUCE, _SHAPES[0], done))
        dumps.append(_dump(rank, entries))
    result = match(dumps, _OneGroup(tuple(range(6))))
    _assert_as_by_entries(result)
    all_to_all, hang, finished, odd = result.collectives
    assert all_to_all.disagreement is None and all_to_all.completed_ranks == tuple(range(6))
    assert hang.disagreement is None and hang.completed_ranks == (0,)
    assert finished.completed_ranks == tuple(range(6))  # rank 3 says so by `retired` alone
    assert odd.not_issued == (5,) and odd.disagreement is not None
    assert (odd.disagreement.kind, odd.disagreement.odd_ranks) == ("op_mismatch", (2,))


# --------------------------------------------------------------------------- P2P

# One P2P op of a rank in a group of _P2P_RANKS: (kind, peer, p2p_seq_id, op_id, done). A
# peer outside the group or a `recv ?` (peer None) has no channel of both ends.
_P2P_RANKS = 3
_p2p_op = st.tuples(st.sampled_from(["send", "recv", "batch_end"]), st.one_of(st.integers(0, _P2P_RANKS), st.none()),
                    st.integers(0, 12), st.integers(0, 3), _DONE)


def _p2p_entries(rank: int, ops: list, first_record: int) -> list:
    entries = []
    for index, (kind, peer, p2p_seq, op_id, done) in enumerate(ops):
        peer_text = "?" if peer is None else str(peer)
        if kind == "batch_end":  # closes a batch: its p2p_seq_id's ops were batched
            name, done = _P2P_MARKER, ("completed", None, None)
        elif kind == "send":
            name = OpName(f"nccl:send {rank}->{peer_text}", "nccl", "send", True, rank, -1 if peer is None else peer)
        else:
            name = OpName(f"nccl:recv {rank}<-{peer_text}", "nccl", "recv", True, -1 if peer is None else peer, rank)
        entries.append(_entry(index, 0, name, _SHAPES[0], done, p2p_seq=p2p_seq, op_id=op_id, first_record=first_record))
    return entries


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_p2p_op, max_size=14), min_size=_P2P_RANKS, max_size=_P2P_RANKS),
       st.lists(st.sampled_from([0, 0, 5]), min_size=_P2P_RANKS, max_size=_P2P_RANKS))
def test_p2p_pairs_are_those_of_the_entries(ranks, first_records):
    # A rank whose first record id is not 0 wrapped its ring buffer: its channels pair by completion.
    dumps = [_dump(rank, _p2p_entries(rank, ops, first)) for rank, (ops, first) in enumerate(zip(ranks, first_records))]
    result = match(dumps, _OneGroup(tuple(range(_P2P_RANKS))))
    assert _pairs(result, 0) == _paired_by_entries(result.views[0])
    sent = sum(1 for ops in ranks for op in ops if op[0] == "send" and op[1] is not None and op[1] < _P2P_RANKS)
    assert sum(p.send_table is not None for p in result.p2p) == sent


def test_p2p_pairs_of_a_wrapped_channel_and_a_batch():
    """Rank 0 sends four ops to rank 1, the second of them in a batch; rank 1's buffer
    wrapped and kept its last two plain recvs, the newest still pending, and the batched
    recv. Completed ops pair from the newest back, pending ones from the oldest on."""
    done, pending = ("completed", True, None), ("scheduled", None, None)
    sender = [_entry(0, 0, OpName("nccl:send 0->1", "nccl", "send", True, 0, 1), _SHAPES[0], done, p2p_seq=1),
              _entry(1, 0, OpName("nccl:send 0->1", "nccl", "send", True, 0, 1), _SHAPES[0], done, p2p_seq=2),
              _entry(2, 0, _P2P_MARKER, _SHAPES[0], done, p2p_seq=2),
              _entry(3, 0, OpName("nccl:send 0->1", "nccl", "send", True, 0, 1), _SHAPES[0], done, p2p_seq=3),
              _entry(4, 0, OpName("nccl:send 0->1", "nccl", "send", True, 0, 1), _SHAPES[0], pending, p2p_seq=4)]
    receiver = [_entry(0, 0, OpName("nccl:recv 1<-0", "nccl", "recv", True, 0, 1), _SHAPES[0], done, p2p_seq=2,
                       first_record=7),
                _entry(1, 0, _P2P_MARKER, _SHAPES[0], done, p2p_seq=2, first_record=7),
                _entry(2, 0, OpName("nccl:recv 1<-0", "nccl", "recv", True, 0, 1), _SHAPES[0], done, p2p_seq=3,
                       first_record=7),
                _entry(3, 0, OpName("nccl:recv 1<-0", "nccl", "recv", True, 0, 1), _SHAPES[0], pending, p2p_seq=4,
                       first_record=7)]
    result = match([_dump(0, sender), _dump(1, receiver)], _OneGroup((0, 1)))
    assert _pairs(result, 0) == _paired_by_entries(result.views[0])
    send_rows = [(p.send_row if p.send_table is not None else None) for p in result.p2p]
    recv_rows = [(p.recv_row if p.recv_table is not None else None) for p in result.p2p]
    # Plain: send 0 lost its recv off the wrapped buffer, sends 3 and 4 pair with recvs 2
    # and 3; batched: send 1 with recv 0.
    assert list(zip(send_rows, recv_rows)) == [(0, None), (3, 2), (4, 3), (1, 0)]


# --------------------------------------------------------------------------- realistic jobs


@pytest.mark.parametrize("fault, options", [
    (Fault("hang", rank=3, group="dp", step=1), {"p2p": "mixed"}),
    (Fault("p2p_unmatched", rank=2, group="pp", step=1), {"p2p": "batched", "buffer_size": 150}),
    (Fault("stuck", rank=5, group="pp", step=1), {"p2p": "mixed", "buffer_size": 200}),
    (Fault("size_mismatch", rank=1, group="tp", step=1), {}),
    (Fault("op_mismatch", rank=6, group="dp", step=2), {"p2p": "mixed"}),
    (Fault("dtype_mismatch", rank=4, group="tp", step=0), {"buffer_size": 120}),
    (Fault("skip_op", rank=7, group="tp", step=1), {"p2p": "batched"}),
])
def test_synthetic_jobs_match_as_their_entries_say(tmp_path, fault, options):
    write_synth_job(tmp_path, generate(16, 2, 2, steps=3, fault=fault, seed=3, **options))
    loaded = load_dumps([tmp_path], workers=1)
    result = match(loaded.dumps, build_layout(loaded.dumps, loaded.failed_ranks, None))
    assert result.p2p and any(m.disagreement or len(m.completed_ranks) < len(m.calls) for m in result.collectives)
    _assert_as_by_entries(result)
