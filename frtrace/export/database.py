"""Flatten a `MatchResult` into the `Database` tables.

Takes the match result; returns `Database(groups, memberships, tracebacks,
collectives, ncclcalls)` whose ids join: `Collective.group_id` and
`Membership.group_id` are `Group.id`s, every `NCCLCall` carries its rank's own view
of the op and the `collective_id` of the Collective it belongs to (a failed one is
still a row, with what went wrong in `problem`), and `traceback_id` points into
`tracebacks`. Ids are assigned in sorted (group, sequence, rank) order so two runs on
the same dumps give identical tables.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Optional

from frtrace.match.matcher import CollectiveMatch, GroupView, MatchResult, P2PMatch
from frtrace.model import Collective, Database, Entry, Frame, NCCLCall, Traceback
from frtrace.util import fold_ranks


class _TracebackTable:
    def __init__(self) -> None:
        self.ids: dict[tuple[Frame, ...], int] = {}
        self.by_identity: dict[int, int] = {}  # id() of a stack -> its id
        self.rows: list[Traceback] = []

    def id_for(self, frames: tuple[Frame, ...]) -> Optional[int]:
        if not frames:
            return None
        # Stacks are interned per file, so most lookups hit by identity; equal stacks
        # from different files still share one id through the value lookup.
        tid = self.by_identity.get(id(frames))
        if tid is None:
            tid = self.ids.get(frames)
            if tid is None:
                tid = self.ids[frames] = len(self.rows)
                self.rows.append(Traceback(tid, frames))
            self.by_identity[id(frames)] = tid
        return tid


def _describe_disagreement(match: CollectiveMatch) -> str:
    dis = match.disagreement
    assert dis is not None
    parts = []
    for ranks, _sig in dis.classes:
        entry = match.calls[ranks[0]][0]
        shapes = entry.shapes
        parts.append(f"ranks {fold_ranks(ranks)}: {entry.op} {list(map(list, shapes.input_sizes))} {list(shapes.input_dtypes)}")
    return f"{dis.kind}{' (tie)' if dis.tie else ''}: " + "; ".join(parts)


def collective_state(match: CollectiveMatch) -> tuple[str, Optional[str]]:
    """(state, problem) of one collective as the group saw it."""
    if match.disagreement is not None:
        return "mismatch", _describe_disagreement(match)
    completed = match.completed_ranks
    if match.not_issued:
        return "partial", f"not issued by ranks {fold_ranks(match.not_issued)}"
    if match.no_dump and not completed:
        return "partial", f"ranks {fold_ranks(match.no_dump)} have no dump"
    if completed:
        return "completed", None
    return "in_flight", None


def _majority_entry(calls: Mapping[int, tuple[Entry, ...]]) -> Entry:
    counts = Counter(entries[0].name.profiling_name for entries in calls.values())
    top = counts.most_common(1)[0][0]
    return next(entries[0] for _, entries in sorted(calls.items()) if entries[0].name.profiling_name == top)


def _call_row(call_id: int, collective_id: int, group_id: int, rank: int, entry: Entry, tracebacks: _TracebackTable) -> NCCLCall:
    shapes = entry.shapes
    return NCCLCall(
        call_id, collective_id, group_id, rank, entry.record_id, entry.name.profiling_name, entry.op,
        entry.collective_seq_id, entry.p2p_seq_id, entry.op_id,
        shapes.input_sizes, shapes.output_sizes, shapes.input_dtypes, shapes.output_dtypes,
        entry.state, entry.retired, entry.time_created_ns, entry.time_started_ns, entry.time_completed_ns,
        entry.duration_ms, entry.timeout_ms, tracebacks.id_for(entry.frames),
    )


def _p2p_rows(p2p: P2PMatch, collective_id: int,
              views: tuple[GroupView, ...]) -> tuple[Collective, list[tuple[int, Entry]]]:
    group = views[p2p.group_id].group
    ends = ((p2p.src, p2p.send), (p2p.dst, p2p.recv))  # each built once (see P2PMatch)
    present = [(rank, e) for rank, e in ends if e is not None]
    entry = present[0][1]
    missing = tuple(r for r, e in ends if e is None and r >= 0)
    completed = tuple(r for r, e in present if e.completed)
    state = "completed" if not missing and completed else ("partial" if missing else "in_flight")
    problem = None
    if missing:
        problem = f"p2p_unmatched: {entry.op} on rank {present[0][0]} has no partner on rank {fold_ranks(missing) or '?'}"
    no_dump = tuple(r for r in missing if r in views[p2p.group_id].no_dump)
    shapes = entry.shapes
    row = Collective(
        collective_id, group.id, "p2p", None, entry.p2p_seq_id, f"{entry.op} {p2p.src}->{p2p.dst}",
        shapes.input_sizes, shapes.output_sizes, shapes.input_dtypes, shapes.output_dtypes,
        tuple(sorted({p2p.src, p2p.dst} - {-1})), tuple(r for r, _ in present), completed,
        tuple(r for r in missing if r not in no_dump), no_dump, (), state, problem,
    )
    return row, present


def build_database(result: MatchResult) -> Database:
    tracebacks = _TracebackTable()
    collectives: list[Collective] = []
    calls: list[NCCLCall] = []
    for match in result.collectives:
        cid = len(collectives)
        # Each entry built once: a settled collective's calls are read off the tables on demand.
        match_calls = dict(sorted(match.calls.items()))
        entry = _majority_entry(match_calls)
        shapes = entry.shapes
        state, problem = collective_state(match)
        expected = tuple(sorted(set(match_calls) | set(match.not_issued) | set(match.no_dump)))
        collectives.append(Collective(
            cid, match.group_id, "collective", match.seq, None, entry.op,
            shapes.input_sizes, shapes.output_sizes, shapes.input_dtypes, shapes.output_dtypes,
            expected, match.issued, match.completed_ranks, match.not_issued, match.no_dump,
            match.out_of_window, state, problem,
        ))
        for rank, entries in match_calls.items():
            for entry in entries:
                calls.append(_call_row(len(calls), cid, match.group_id, rank, entry, tracebacks))
    for p2p in result.p2p:
        cid = len(collectives)
        row, present = _p2p_rows(p2p, cid, result.views)
        collectives.append(row)
        for rank, entry in present:
            calls.append(_call_row(len(calls), cid, p2p.group_id, rank, entry, tracebacks))
    layout = result.layout
    return Database(list(layout.groups), list(layout.memberships), tracebacks.rows, collectives, calls)
