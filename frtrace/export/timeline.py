"""Draw the dumps as a Chrome trace-event timeline for Perfetto and chrome://tracing.

Takes a path (the temporary file `outputs.write_atomically` renames into place), the
`Analysis`, the `Diagnosis`, optionally the ranks and groups (name or desc) to draw,
whether to draw every rank, and whether to gzip; writes `{"traceEvents": [...],
"displayTimeUnit": "ms", "otherData": {...}}` and returns the `Selection` it drew.

Which ranks (`choose_ranks`): the ranks asked for; else, when the diagnosis has root
findings, the ranks around them (their suspects, the ranks waiting on them, the other
ranks they name: each with all its groups); else every rank. Without an explicit choice
the ranks stop at a budget of entries (`DEFAULT_ENTRY_BUDGET`), and a note says what
was left out, in `otherData.selection` and for the CLI to print.

What is drawn:

- one process per rank ("rank N"; pid is rank + 1 because Perfetto reserves pid 0
  for the kernel's idle task), and an empty "rank N (no dump)" for a missing dump;
- one thread track per process group ("pg NAME (desc)") with one complete ("X") slice
  per op, from when it started to when it completed, as far as the dump tells: the
  watchdog's discovery times (it polls about every 100 ms), so both ends can be late by
  up to a poll. Without a start time an op is drawn from the later of its creation and
  the end of the group's previous op (ops of one group run one after the other on the
  group's stream); the time it sat queued is an argument (`queued_ms`), not drawn as
  work. A coalesced batch is one slice (its ops listed in `args.ops`). An op that was
  enqueued but never started (behind one that never finished) is an instant
  ("queued: ...") at its creation. Complete events on one track must nest, and
  Perfetto drops those that do not, so an op that still overlaps the previous one
  (an async op) goes to an extra track of the group ("pg NAME (desc) +1"): a healthy
  job needs none;
- flow arrows between the entries of one collective across ranks (in order of
  arrival) and from each send to its recv;
- an instant on each rank that never issued a collective its peers issued, at that
  rank's last timestamp, on a track of its own ("pg NAME (desc): not issued"), and
  one global instant per finding at its divergence.

Timestamps are microseconds relative to the job's earliest entry, each rank on its own
host clock as dumped: they are not aligned (hosts differ by whatever NTP leaves, and
the watchdog's discovery times are no clock to align by). Events are written one by
one as they are made; only small per-entry anchors for the flow arrows are kept.
"""

from __future__ import annotations

import contextlib
import gzip
import heapq
import io
import json
from collections import defaultdict
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, TextIO

from frtrace._version import __version__
from frtrace.diagnosis import Diagnosis, Finding
from frtrace.load.layout import Layout
from frtrace.match.analysis import Analysis
from frtrace.match.matcher import CollectiveMatch
from frtrace.model import Entry, Group
from frtrace.table.batches import batch_start
from frtrace.table.entry_table import EntryTable
from frtrace.table.rank_dump import RankDump, clocks_compare
from frtrace.util import fold_ranks
from frtrace.wording import call_site, group_label, json_printable

SCHEMA_VERSION = "frtrace.timeline/2"
# Without --timeline-all or --selected-ranks, ranks are drawn until their entries reach
# this many (at ~500 bytes an entry, some 50 MB of JSON, 5 MB gzipped): a trace
# ui.perfetto.dev opens in seconds.
DEFAULT_ENTRY_BUDGET = 100_000
# Perfetto turns the microsecond floats into integer nanoseconds by truncating
# `ts * 1000`, so 1.005 µs can become 1004 ns and a slice could end 1 ns after its
# neighbour starts: an overlap that gets it dropped. A quarter nanosecond added to
# every value makes the truncation land on the exact integer.
_TRUNCATION_GUARD_NS = 0.25
# Slices are drawn at least this long (their args keep the true times): a stand-in
# end can equal the start, and a zero-length slice can neither be clicked nor carry
# a flow arrow, which must sit strictly inside its slice.
_MIN_DRAWN_NS = 1000
_MARKER_LANE = -1  # not-issued markers get a track of their own next to the group's
# The watchdog notices a start or a completion up to one poll (~100 ms) late, so when ops
# of a group run in turn, the next op's discovered start can precede this op's
# discovered completion by up to a poll: this op's drawn end is then the next one's
# start. An overlap longer than this (two polls) means the two really ran at once (an
# async op): the later one goes to an extra lane.
_DISCOVERY_SLACK_NS = 200_000_000
_BATCH_NAMES_SHOWN = 3
# One trace event, ready for json: str keys, JSON values.
TraceEvent = dict[str, object]
# Where a flow arrow starts or ends: (pid, tid, ns inside the entry's slice).
Anchor = tuple[int, int, int]
# (rank, entry index) -> the anchor of that entry's slice.
Anchors = dict[tuple[int, int], Anchor]
# A shape list: one tuple of dimensions per tensor.
Sizes = tuple[tuple[int, ...], ...]

# How each slice's start and end were known: short in every slice's args, explained
# once in `otherData.legend`.
START_DISCOVERED = "discovered start"
START_CREATED = "creation"
START_AFTER_PREVIOUS = "previous op's end"
END_COMPLETED = "discovered completion"
END_NEXT_STARTED = "next op's discovered start"
END_DURATION = "start + duration_ms"
END_NEVER = "never completed: dump time"
END_RETIRED = "stand-in: next entry's creation"
END_RETIRED_LAST = "stand-in: dump time"
LEGEND = {
    START_DISCOVERED: "time_started_ns, when the watchdog noticed the start (it polls ~every 100 ms, so up to a poll late)",
    START_CREATED: "no start time in the dump: drawn from its creation (the group's previous op had ended)",
    START_AFTER_PREVIOUS: "no start time in the dump: drawn from the end of the group's previous op (ops of one "
                          "group run in turn); it was created earlier (queued_ms)",
    END_COMPLETED: "time_completed_ns, when the watchdog noticed completion (up to a poll late)",
    END_NEXT_STARTED: "the group's next op was discovered started before this one's discovered completion "
                      "(time_completed_ns): ops of one group run in turn, so this one had ended by then",
    END_DURATION: "the start plus duration_ms (no completion time in the dump)",
    END_NEVER: "never completed: drawn to the dump time (this rank's newest timestamp)",
    END_RETIRED: "only `retired` is known (gloo): drawn to this rank's next entry's creation",
    END_RETIRED_LAST: "only `retired` is known (gloo): drawn to the dump time (this rank's newest timestamp)",
    "queued_ms": "from the op's creation (time_created_ns, when the host enqueued it) to the drawn start",
}
QUEUED_NOTE = "enqueued, never started: queued behind an op that had not finished when the rank dumped"
CLOCKS_NOTE = ("each rank on its own host clock as dumped, not aligned: hosts differ by whatever NTP leaves "
               "(usually ms); starts and ends are the watchdog's discovery times (polled ~every 100 ms), "
               "so they bound when things happened and are no clock to align ranks by")
CUPTI_CLOCKS_NOTE = ("each rank on CUPTI's own clock as the comms monitor dumped it (no clock converter given), "
                     "which each host counts from an origin of its own: ranks of different hosts do not line up at all")


class Selection(NamedTuple):
    """The ranks a timeline draws and why."""

    ranks: Optional[frozenset[int]]  # None: every rank
    basis: str  # "all" | "selected" | "findings" | "cap"
    note: Optional[str]  # what was left out and how to draw it; None when nothing was


class _Track(NamedTuple):
    tid: int
    group_id: int
    lane: int
    name: str


class _Slice(NamedTuple):
    start: int  # ns on the rank's own clock
    end: int
    entry: Entry  # a batch's end marker for a batch
    group_id: int
    start_source: str
    end_source: str
    members: tuple[Entry, ...]  # the ops of a coalesced batch; () for a single op


class _Queued(NamedTuple):
    entry: Entry
    group_id: int


# --------------------------------------------------------------------------- selection


def _focus_ranks(diagnosis: Diagnosis) -> list[int]:
    """Ranks around the root findings, most telling first: suspects, the ranks waiting
    on them, the other ranks the findings name."""
    roots = [f for f in diagnosis.findings if f.is_root and f.severity in ("error", "warning")]
    ordered: dict[int, None] = {}
    picks: tuple[Callable[[Finding], tuple[int, ...]], ...] = (
        lambda f: f.suspect_ranks, lambda f: f.waiting_ranks, lambda f: f.ranks)
    for pick in picks:
        for finding in roots:
            for rank in pick(finding):
                ordered.setdefault(rank, None)
    for rank in diagnosis.suspect_ranks:
        ordered.setdefault(rank, None)
    return [r for r in ordered if r >= 0]


def choose_ranks(analysis: Analysis, diagnosis: Diagnosis, ranks: Optional[Iterable[int]] = None, *,
                 draw_all: bool = False, budget: int = DEFAULT_ENTRY_BUDGET) -> Selection:
    """The ranks to draw: `ranks` when given, every rank with `draw_all`, else the ranks
    around the root findings (or every rank) up to `budget` entries, with a note."""
    if ranks is not None:
        return Selection(frozenset(ranks), "selected", None)
    if draw_all:
        return Selection(None, "all", None)
    layout = analysis.layout
    sizes = {d.rank: len(d.entries) for d in layout.usable(analysis.load.dumps)}
    job = sorted(set(sizes) | set(layout.ranks_missing))
    known = set(job)
    focus = [r for r in _focus_ranks(diagnosis) if r in known]
    candidates = focus or job
    drawn: list[int] = []
    total = 0
    for rank in candidates:
        cost = max(1, sizes.get(rank, 0))
        if drawn and total + cost > budget:
            break
        drawn.append(rank)
        total += cost
    how = "--timeline-all draws every rank, --selected-ranks picks ranks"
    if focus:
        capped = "" if len(drawn) == len(focus) else f" (capped at {budget:,} entries: {len(focus) - len(drawn)} more)"
        note = (f"timeline: drew ranks {fold_ranks(drawn)} of {len(job)}, the ranks around the findings"
                f" (suspects {fold_ranks(diagnosis.suspect_ranks) or 'none'}){capped}; {how}")
        return Selection(frozenset(drawn), "findings", note)
    if len(drawn) == len(job):
        return Selection(None, "all", None)
    note = (f"timeline: drew ranks {fold_ranks(drawn)} of {len(job)} (capped at {budget:,} entries); {how}")
    return Selection(frozenset(drawn), "cap", note)


# --------------------------------------------------------------------------- slices


def _newest_ns(entries: EntryTable) -> int:
    """The newest timestamp a rank wrote: the closest thing to its dump time (0 for a dump
    that holds no entry: dumped without collectives, or only active ones, all finished).
    Read a field at a time: every rank's is needed, for the trace's clock."""
    created = entries.field("time_created_ns")
    newest: int = max(created, default=0)
    for name in ("time_started_ns", "time_completed_ns"):
        newest = max(newest, max(filter(None, entries.field(name)), default=newest))
    durations = entries.field("duration_ms")
    if any(d is not None for d in durations):
        newest = max(newest, max(c + int(round(d * 1e6)) for c, d in zip(created, durations) if d is not None))
    return newest



def _end_of(entry: Entry, start: int, next_entry: Optional[Entry], dump_time: int) -> tuple[int, str]:
    """(end ns, how it was known) for one op."""
    if entry.time_completed_ns:
        return entry.time_completed_ns, END_COMPLETED
    if entry.duration_ms is not None:
        return start + int(round(entry.duration_ms * 1e6)), END_DURATION
    if not entry.completed:
        return dump_time, END_NEVER
    if next_entry is not None:
        return next_entry.time_created_ns, END_RETIRED
    return dump_time, END_RETIRED_LAST


def _batches(entries: EntryTable) -> tuple[dict[int, int], dict[int, list[Entry]]]:
    """(member index -> its end marker's index, marker index -> member entries)."""
    marker_of: dict[int, int] = {}
    members: defaultdict[int, list[Entry]] = defaultdict(list)
    for position, entry in enumerate(entries):
        if entry.name.is_coalesced_marker:
            for i in range(batch_start(entries, position), position):
                marker_of[i] = position
                members[position].append(entries[i])
    return marker_of, members


def _rank_ops(dump: RankDump, layout: Layout, wanted: set[int]) -> tuple[list[_Slice], list[_Queued], dict[int, int]]:
    """(slices ordered by start, queued ops, member index -> marker index) of one rank."""
    entries = dump.entries
    dump_time = _newest_ns(entries) or 0
    timed = any(e.time_started_ns for e in entries)  # the dump records when ops start
    marker_of, members = _batches(entries) if any(e.name.is_coalesced_marker for e in entries) else ({}, {})
    previous: dict[int, tuple[int, bool]] = {}  # group id -> (end of its previous op, whether that op finished)
    last: dict[int, int] = {}  # group id -> index in `slices` of its previous op
    slices: list[_Slice] = []
    queued: list[_Queued] = []
    for i, entry in enumerate(entries):
        if i in marker_of:
            continue
        gid = layout.group_of(entry.pg_name, dump.rank)
        if gid is None or gid not in wanted:
            continue
        before = previous.get(gid)
        if entry.time_started_ns:
            start, start_source = entry.time_started_ns, START_DISCOVERED
        elif not entry.completed and (timed or (before is not None and not before[1])):
            queued.append(_Queued(entry, gid))
            continue
        elif before is not None and before[0] > entry.time_created_ns:
            start, start_source = before[0], START_AFTER_PREVIOUS
        else:
            start, start_source = entry.time_created_ns, START_CREATED
        end, end_source = _end_of(entry, start, entries[i + 1] if i + 1 < len(entries) else None, dump_time)
        end = max(end, start + _MIN_DRAWN_NS)
        previous[gid] = (end, entry.completed)
        if gid in last:
            _end_at_next_start(slices, last[gid], start)
        last[gid] = len(slices)
        slices.append(_Slice(start, end, entry, gid, start_source, end_source, tuple(members.get(i, ()))))
    slices.sort(key=lambda s: (s.start, s.end, s.entry.index))
    return slices, queued, marker_of


def _end_at_next_start(slices: list[_Slice], index: int, next_start: int) -> None:
    """End the completed op at `slices[index]` when the group's next op started, if that
    is before its discovered completion by no more than the discovery slack."""
    before = slices[index]
    if (before.end_source == END_COMPLETED and before.start + _MIN_DRAWN_NS <= next_start < before.end
            and before.end - next_start <= _DISCOVERY_SLACK_NS):
        slices[index] = before._replace(end=next_start, end_source=END_NEXT_STARTED)


def _assign_lanes(slices: list[_Slice]) -> list[int]:
    """Lane of each slice within its group: the lowest-numbered lane whose last slice has
    ended when it starts (touching is fine), so no two slices of a lane overlap.

    Slices come ordered by start, so a lane that has ended stays free until it is taken
    again: per group, a heap of (end, lane) of busy lanes and a heap of free lane numbers
    give the same lanes as trying every lane in turn, in O(n log n) rather than O(n x lanes)."""
    busy: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)  # group id -> heap of (end, lane)
    free: defaultdict[int, list[int]] = defaultdict(list)  # group id -> heap of lane numbers
    opened: defaultdict[int, int] = defaultdict(int)  # group id -> lanes opened so far
    lanes = []
    for s in slices:
        ends, spare = busy[s.group_id], free[s.group_id]
        while ends and ends[0][0] <= s.start:
            heapq.heappush(spare, heapq.heappop(ends)[1])
        if spare:
            lane = heapq.heappop(spare)
        else:
            lane = opened[s.group_id]
            opened[s.group_id] += 1
        heapq.heappush(ends, (s.end, lane))
        lanes.append(lane)
    return lanes


# --------------------------------------------------------------------------- events


def _group_label(group: Group) -> str:
    return f"pg {group_label(group.name, group.desc)}"


def _op_label(entry: Entry) -> str:
    if entry.is_p2p:
        # `send 0->1` says more than `send`; the peers are group-local ranks.
        label = entry.name.profiling_name.split(":", 1)[-1]
        return f"{label} p2p#{entry.p2p_seq_id}"
    return f"{entry.op} #{entry.collective_seq_id}"


def _batch_label(marker: Entry, members: tuple[Entry, ...]) -> str:
    names = [m.name.profiling_name.split(":", 1)[-1] for m in members[:_BATCH_NAMES_SHOWN]]
    more = f", +{len(members) - _BATCH_NAMES_SHOWN}" if len(members) > _BATCH_NAMES_SHOWN else ""
    seq = f"p2p#{members[0].p2p_seq_id}" if members[0].is_p2p else f"#{marker.collective_seq_id}"
    return f"batch {seq}: {', '.join(names)}{more}"


class _Writer:
    """Turns ns into trace microseconds and events into JSON text on `out`."""

    def __init__(self, out: TextIO, origin_ns: int) -> None:
        self.out = out
        self.origin = origin_ns
        self.first = True
        self.encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode
        self.shapes: dict[Sizes, str] = {}
        self.slices = 0

    def us(self, ns: int) -> float:
        return (ns - self.origin + _TRUNCATION_GUARD_NS) / 1000.0

    def dur(self, ns: int) -> float:
        return (ns + _TRUNCATION_GUARD_NS) / 1000.0

    def shape_text(self, value: Sizes) -> str:
        text = self.shapes.get(value)
        if text is None:
            text = self.shapes[value] = json.dumps(value, separators=(",", ":"))
        return text

    def emit(self, event: TraceEvent) -> None:
        # Dump strings are written as they are, but a control or bidi character among
        # them as its JSON escape (wording.json_printable): a viewer or terminal shows it.
        self.out.write(("\n" if self.first else ",\n") + json_printable(self.encode(event)))
        self.first = False


def _metadata(pid: int, name: str, args: dict[str, object], tid: Optional[int] = None) -> TraceEvent:
    # "ph" leads: Perfetto's tokenizer looks for it (and "ts") before reading the rest.
    event: TraceEvent = {"ph": "M", "pid": pid}
    if tid is not None:
        event["tid"] = tid
    event["name"] = name
    event["args"] = args
    return event


def _entry_args(w: _Writer, e: Entry) -> dict[str, object]:
    """What a slice or instant says about its op; absent values are left out."""
    shapes = e.shapes
    args: dict[str, object] = {"profiling_name": e.name.profiling_name}
    if e.is_p2p:
        args["p2p_seq_id"] = e.p2p_seq_id
    else:
        args["collective_seq_id"] = e.collective_seq_id
    args.update(op_id=e.op_id, record_id=e.record_id, state=e.state)
    if e.retired is not None:
        args["retired"] = e.retired
    if shapes.input_sizes or shapes.output_sizes:
        args.update(input_sizes=w.shape_text(shapes.input_sizes), input_dtypes=list(shapes.input_dtypes),
                    output_sizes=w.shape_text(shapes.output_sizes), output_dtypes=list(shapes.output_dtypes))
    args["time_created_ns"] = e.time_created_ns
    for key in ("time_started_ns", "time_completed_ns", "duration_ms", "timeout_ms"):
        value = getattr(e, key)
        if value is not None:
            args[key] = value
    site = call_site(e)
    if site:
        args["call_site"] = site
    return args


def _slice_event(w: _Writer, pid: int, tid: int, s: _Slice) -> TraceEvent:
    e = s.entry
    # Group name and desc are on the track; the op is in the slice name and profiling_name.
    args = _entry_args(w, e)
    if s.members:
        args["ops"] = [f"{m.name.profiling_name} {w.shape_text(m.shapes.input_sizes)}" for m in s.members]
    args["queued_ms"] = round(max(0, s.start - e.time_created_ns) / 1e6, 3)
    args["start"] = s.start_source
    args["end"] = s.end_source
    w.slices += 1
    return {
        "ph": "X", "ts": w.us(s.start), "dur": w.dur(s.end - s.start), "pid": pid, "tid": tid,
        "name": _batch_label(e, s.members) if s.members else _op_label(e),
        "cat": "p2p" if e.is_p2p else "collective", "args": args,
    }


def _queued_event(w: _Writer, pid: int, tid: int, q: _Queued) -> TraceEvent:
    args = _entry_args(w, q.entry)
    args["note"] = QUEUED_NOTE
    return {"ph": "i", "ts": w.us(q.entry.time_created_ns), "pid": pid, "tid": tid, "s": "t",
            "name": f"queued: {_op_label(q.entry)}", "cat": "queued", "args": args}


def _flow_pair(w: _Writer, flow_id: int, name: str, cat: str, source: Anchor, target: Anchor) -> Iterator[TraceEvent]:
    for ph, (pid, tid, at) in (("s", source), ("f", target)):
        yield {"ph": ph, "ts": w.us(at), "pid": pid, "tid": tid, "name": name, "cat": cat, "id": flow_id, "bp": "e"}


# --------------------------------------------------------------------------- plan


class _Plan:
    """What to draw and where: the selection and the time origin."""

    def __init__(self, analysis: Analysis, diagnosis: Diagnosis, selection: Selection,
                 pg_filters: Iterable[str]) -> None:
        self.analysis = analysis
        self.diagnosis = diagnosis
        self.selection = selection
        layout = analysis.layout
        self.layout = layout
        self.groups: dict[int, Group] = {g.id: g for g in layout.groups}
        filters = set(pg_filters or ())
        self.wanted = {g.id for g in layout.groups if not filters or g.name in filters or g.desc in filters}
        selected = selection.ranks
        usable = layout.usable(analysis.load.dumps)
        self.dumps = [d for d in usable if selected is None or d.rank in selected]
        self.missing = [r for r in layout.ranks_missing if selected is None or r in selected]
        self.drawn = {d.rank for d in self.dumps}
        self.job_ranks = len(usable) + len(layout.ranks_missing)
        # Origin and end over the whole job, so a narrowed trace keeps the same clock.
        starts: list[int] = []
        ends: list[int] = []
        self.rank_last: dict[int, int] = {}
        for dump in usable:
            if not dump.entries:
                continue
            # An op in flight in a CUPTI monitor's dump has no time yet (0): no origin.
            starts.append(min((t for t in dump.entries.field("time_created_ns") if t), default=0))
            self.rank_last[dump.rank] = _newest_ns(dump.entries)
            ends.append(self.rank_last[dump.rank])
        self.origin = min(starts) if starts else 0
        self.end = max(ends) if ends else self.origin

    def not_issued_by_rank(self) -> dict[int, list[CollectiveMatch]]:
        """rank -> CollectiveMatches (of wanted groups) its peers issued and it never did."""
        out: defaultdict[int, list[CollectiveMatch]] = defaultdict(list)
        for match in self.analysis.matches.collectives:
            if match.group_id in self.wanted and match.calls:
                for rank in match.not_issued:
                    if rank in self.drawn:
                        out[rank].append(match)
        return out

    def other_data(self) -> dict[str, object]:
        diagnosis = self.diagnosis
        shown = sorted(self.drawn | set(self.missing))
        return {
            "schema": SCHEMA_VERSION,
            "frtrace_version": __version__,
            "time_origin_ns": self.origin,
            "clocks": {"aligned": False,
                       "note": CLOCKS_NOTE if clocks_compare(self.dumps) else CUPTI_CLOCKS_NOTE},
            "legend": LEGEND,
            "selection": {
                "basis": self.selection.basis,
                "note": self.selection.note,
                "ranks_drawn": len(shown),
                "ranks_in_job": self.job_ranks,
            },
            "status": diagnosis.status,
            "suspect_ranks": list(diagnosis.suspect_ranks),
            "verdict": diagnosis.verdict,
            "ranks": shown,
            "groups": [_group_label(self.groups[g]) for g in sorted(self.wanted)],
        }


class _Tids:
    """Thread ids unique across the whole trace, assigned in (rank, group, lane)
    order: Perfetto names a thread by tid alone in metadata events."""

    def __init__(self, first: int) -> None:
        self.next = first

    def take(self) -> int:
        tid, self.next = self.next, self.next + 1
        return tid


def _track_name(group: Group, lane: int) -> str:
    label = _group_label(group)
    if lane == _MARKER_LANE:
        return f"{label}: not issued"
    return label if lane == 0 else f"{label} +{lane}"


def _rank_tracks(keys: set[tuple[int, int]], groups: dict[int, Group], tids: _Tids) -> dict[tuple[int, int], _Track]:
    """(group id, lane) -> _Track for one rank. Not-issued markers get their own track:
    on a slice track, a zero-length marker would capture the flow arrows of the slice
    it lands in."""
    return {(gid, lane): _Track(tids.take(), gid, lane, _track_name(groups[gid], lane)) for gid, lane in sorted(keys)}


def _rank_events(plan: _Plan, w: _Writer, dump: RankDump, tids: _Tids, markers: list[CollectiveMatch],
                 anchors: Anchors) -> Iterator[TraceEvent]:
    """Metadata, slices, queued ops and not-issued markers of one rank; fills `anchors`
    with (pid, tid, ns inside the slice) per entry index for the flow arrows."""
    rank, pid = dump.rank, dump.rank + 1
    slices, queued, marker_of = _rank_ops(dump, plan.layout, plan.wanted)
    lanes = _assign_lanes(slices)
    keys = ({(s.group_id, lane) for s, lane in zip(slices, lanes)} | {(q.group_id, 0) for q in queued}
            | {(m.group_id, _MARKER_LANE) for m in markers})
    tracks = _rank_tracks(keys, plan.groups, tids)
    yield _metadata(pid, "process_name", {"name": f"rank {rank}"})
    yield _metadata(pid, "process_sort_index", {"sort_index": rank})
    for track in tracks.values():
        yield _metadata(pid, "thread_name", {"name": track.name}, track.tid)
        yield _metadata(pid, "thread_sort_index", {"sort_index": track.tid}, track.tid)
    for s, lane in zip(slices, lanes):
        tid = tracks[(s.group_id, lane)].tid
        anchors[(rank, s.entry.index)] = (pid, tid, s.start + _MIN_DRAWN_NS // 2)
        yield _slice_event(w, pid, tid, s)
    for member, marker in marker_of.items():
        anchor = anchors.get((rank, dump.entries[marker].index))
        if anchor is not None:
            anchors[(rank, dump.entries[member].index)] = anchor
    for q in queued:
        yield _queued_event(w, pid, tracks[(q.group_id, 0)].tid, q)
    at = plan.rank_last.get(rank, plan.end)
    for match in markers:
        entry = match.first_entry
        yield {
            "ph": "i", "ts": w.us(at), "pid": pid, "tid": tracks[(match.group_id, _MARKER_LANE)].tid, "s": "t",
            "name": f"NOT ISSUED {entry.op} #{match.seq}", "cat": "not_issued",
            "args": {
                "pg": _group_label(plan.groups[match.group_id]), "collective_seq_id": match.seq, "op": entry.op,
                "issued_by_ranks": list(match.issued),
                "note": f"rank {rank} never issued this collective; placed at its last timestamp",
            },
        }


def _missing_rank_events(plan: _Plan, w: _Writer, rank: int) -> Iterator[TraceEvent]:
    pid = rank + 1
    yield _metadata(pid, "process_name", {"name": f"rank {rank} (no dump)"})
    yield _metadata(pid, "process_sort_index", {"sort_index": rank})
    yield {"ph": "i", "ts": w.us(plan.end), "pid": pid, "s": "p", "name": "NO DUMP", "cat": "missing_dump",
           "args": {"note": f"rank {rank} left no usable dump file"}}


def _flow_events(plan: _Plan, w: _Writer, anchors: Anchors) -> Iterator[TraceEvent]:
    """Collective chains in order of arrival, then send -> recv."""
    flow_id = 0
    for match in plan.analysis.matches.collectives:
        if match.group_id not in plan.wanted:
            continue
        # Only drawn ranks have anchors: the others' entries are never read.
        keys = [(r, match.calls.first_value(r, "index")) for r in match.calls if r in plan.drawn]
        ends = [anchors[key] for key in keys if key in anchors]
        if len(ends) < 2:
            continue
        ends.sort(key=lambda a: (a[2], a[0]))
        name = f"{match.first_entry.op} #{match.seq}"
        for source, target in zip(ends, ends[1:]):
            flow_id += 1
            yield from _flow_pair(w, flow_id, name, "collective", source, target)
    for p2p in plan.analysis.matches.p2p:
        if p2p.group_id not in plan.wanted or not p2p.paired or p2p.src not in plan.drawn or p2p.dst not in plan.drawn:
            continue  # only drawn ranks have anchors
        send, recv = p2p.send, p2p.recv
        assert send is not None and recv is not None  # a paired match holds both ends
        send_at, recv_at = anchors.get((p2p.src, send.index)), anchors.get((p2p.dst, recv.index))
        if send_at and recv_at:
            flow_id += 1
            yield from _flow_pair(w, flow_id, f"{send.op} {p2p.src}->{p2p.dst}", "p2p", send_at, recv_at)


def _finding_time(finding: Finding, matches_by_key: dict[tuple[int, int], CollectiveMatch]) -> Optional[int]:
    """Host-clock ns of the divergence: when the first rank entered the op."""
    match = None
    if finding.group_id is not None and finding.collective_seq_id is not None:  # else it is no collective's
        match = matches_by_key.get((finding.group_id, finding.collective_seq_id))
    if match is not None and match.calls:
        return min(es[0].time_created_ns for es in match.calls.values())
    return finding.age_ns or None


def _wanted_finding(plan: _Plan, finding: Finding) -> bool:
    if finding.group_id is not None and finding.group_id not in plan.wanted:
        return False
    shown = plan.drawn | set(plan.missing)
    return plan.selection.ranks is None or not finding.ranks or bool(set(finding.ranks) & shown)


def _finding_events(plan: _Plan, w: _Writer) -> Iterator[TraceEvent]:
    matches_by_key = {(m.group_id, m.seq): m for m in plan.analysis.matches.collectives}
    some_pid = min(plan.drawn | set(plan.missing), default=0) + 1
    for finding in plan.diagnosis.findings:
        if not _wanted_finding(plan, finding):
            continue
        at = _finding_time(finding, matches_by_key)
        where = f" pg {finding.pg_name}" if finding.group_id is not None else ""
        if finding.collective_seq_id is not None:
            where += f" #{finding.collective_seq_id}"
        elif finding.p2p_seq_id is not None:
            where += f" p2p#{finding.p2p_seq_id}"
        suspects = f" (suspects {','.join(map(str, finding.suspect_ranks))})" if finding.suspect_ranks else ""
        # Global instants belong to no process; the pid is only there for viewers that insist.
        pid = finding.suspect_ranks[0] + 1 if finding.suspect_ranks and finding.suspect_ranks[0] in plan.drawn else some_pid
        yield {
            "ph": "i", "ts": w.us(plan.end if at is None else at), "pid": pid, "s": "g",
            "name": f"{finding.kind}{where}{suspects}", "cat": "finding",
            "args": {
                "kind": finding.kind, "rule": finding.rule, "severity": finding.severity, "root_cause": finding.is_root,
                "message": finding.message, "pg_name": finding.pg_name, "pg_desc": finding.pg_desc,
                "op": finding.op, "collective_seq_id": finding.collective_seq_id, "p2p_seq_id": finding.p2p_seq_id,
                "ranks": list(finding.ranks), "suspect_ranks": list(finding.suspect_ranks),
                "evidence": finding.evidence,
                "placed_at": "the job's last timestamp (no single divergence point)" if at is None
                else "when the first rank entered the op (its own host clock)",
            },
        }


# --------------------------------------------------------------------------- writer


@contextlib.contextmanager
def _open_text(path: str, compress: bool) -> Iterator[io.TextIOWrapper]:
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open(path, "wb"))
        if compress:
            # No file name or time in the gzip header: the same dumps give the same bytes.
            raw = stack.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6))  # type: ignore[arg-type]  # a binary file either way
        # A name holding a lone surrogate (a JSON '\udcff' escape in a dump, or a file name
        # that is not UTF-8) cannot be UTF-8: written as that same escape, it is still
        # valid JSON and reads back as the name the dump held.
        yield stack.enter_context(io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", newline="\n",
                                                   write_through=False))


def write_timeline(path_tmp: str, analysis: Analysis, diagnosis: Diagnosis, ranks: Optional[Iterable[int]] = None,
                   pg_filters: Iterable[str] = (), *, compress: bool = False, draw_all: bool = False,
                   budget: int = DEFAULT_ENTRY_BUDGET) -> Selection:
    """Write the trace-event JSON (gzip-compressed when `compress`) to `path_tmp`;
    return the ranks it drew (see `choose_ranks`)."""
    selection = choose_ranks(analysis, diagnosis, ranks, draw_all=draw_all, budget=budget)
    plan = _Plan(analysis, diagnosis, selection, pg_filters)
    not_issued = plan.not_issued_by_rank()
    # Tids above every pid, so a track is never mistaken for a process's main thread.
    tids = _Tids(analysis.layout.world_size + 2)
    anchors: Anchors = {}
    with _open_text(path_tmp, compress) as out:
        w = _Writer(out, plan.origin)
        out.write('{"traceEvents":[')
        for dump in plan.dumps:
            for event in _rank_events(plan, w, dump, tids, not_issued.get(dump.rank, []), anchors):
                w.emit(event)
        for rank in plan.missing:
            for event in _missing_rank_events(plan, w, rank):
                w.emit(event)
        for event in _flow_events(plan, w, anchors):
            w.emit(event)
        for event in _finding_events(plan, w):
            w.emit(event)
        out.write('\n],\n"displayTimeUnit":"ms",\n"otherData":' + json.dumps(plan.other_data(), default=str) + "}\n")
    return selection
