"""Draw the dumps as a Chrome trace-event timeline for Perfetto and chrome://tracing.

Takes a path (the temporary file `outputs.write_atomically` renames into place), the
`Analysis`, the `Diagnosis`, optionally the ranks and groups (name or desc) to draw,
and whether to gzip; writes `{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}` and returns nothing. What is drawn:

- one process per rank ("rank N"; pid is rank + 1 because Perfetto reserves pid 0
  for the kernel's idle task), and an empty "rank N (no dump)" for a missing dump;
- one thread track per process group ("pg NAME (desc)"), with one complete ("X")
  slice per entry from its creation to its completion (or a stated stand-in end).
  Ops of one group overlap whenever one is enqueued before the previous finished;
  complete events on one track must nest, and Perfetto drops those that do not, so
  an op that would overlap goes to an extra track of the group ("pg NAME (desc) +1",
  ...): nothing is lost;
- flow arrows between the entries of one collective across ranks (in order of
  arrival) and from each send to its recv;
- an instant on each rank that never issued a collective its peers issued, at that
  rank's last timestamp, on a track of its own ("pg NAME (desc): not issued"), and
  one global instant per finding at its divergence.

Timestamps are microseconds relative to the job's earliest entry, after shifting
each rank by its estimated clock offset (`estimate_clock_offsets`); the absolute
origin and the offsets go into `otherData`. Events are written one by one as they
are made; only small per-entry anchors for the flow arrows are kept until the end.
"""

from __future__ import annotations

import contextlib
import gzip
import heapq
import io
import json
from collections import defaultdict
from typing import Iterable, Iterator, NamedTuple, Optional

from . import __version__
from .clocks import estimate_clock_offsets
from .model import Group
from .wording import call_site, group_label

SCHEMA_VERSION = "frtrace.timeline/1"
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

END_COMPLETED = "time_completed_ns"
END_DURATION = "time_created_ns + duration_ms"
END_NEVER = "never completed: drawn to the dump time (this rank's newest timestamp)"
END_RETIRED = "stand-in: only `retired` is known; drawn to this rank's next entry's creation"
END_RETIRED_LAST = "stand-in: only `retired` is known; drawn to the dump time (this rank's newest timestamp)"


class _Track(NamedTuple):
    tid: int
    group_id: int
    lane: int
    name: str


class _Slice(NamedTuple):
    start: int  # aligned ns
    end: int
    entry: object  # model.Entry
    group_id: int
    end_source: str


# --------------------------------------------------------------------------- clocks


def _shift(offsets: dict, rank: int) -> int:
    return int(round(offsets.get(rank, 0)))


def _newest_ns(entries: tuple) -> Optional[int]:
    """The newest timestamp a rank wrote: the closest thing to its dump time."""
    newest = None
    for e in entries:
        top = e.time_created_ns
        if e.time_started_ns and e.time_started_ns > top:
            top = e.time_started_ns
        if e.time_completed_ns and e.time_completed_ns > top:
            top = e.time_completed_ns
        if e.duration_ms is not None and e.time_created_ns + int(round(e.duration_ms * 1e6)) > top:
            top = e.time_created_ns + int(round(e.duration_ms * 1e6))
        if newest is None or top > newest:
            newest = top
    return newest


# --------------------------------------------------------------------------- slices


def _end_of(entry, next_entry, dump_time: int) -> tuple:
    """(raw end ns, how it was known) for one entry."""
    if entry.time_completed_ns:
        return entry.time_completed_ns, END_COMPLETED
    if entry.duration_ms is not None:
        return entry.time_created_ns + int(round(entry.duration_ms * 1e6)), END_DURATION
    if not entry.completed:
        return dump_time, END_NEVER
    if next_entry is not None:
        return next_entry.time_created_ns, END_RETIRED
    return dump_time, END_RETIRED_LAST


def _rank_slices(dump, layout, shift: int, wanted: set) -> list:
    """One slice per entry of the wanted groups, in aligned ns, ordered by start."""
    entries = dump.entries
    dump_time = _newest_ns(entries) or 0
    slices = []
    for i, entry in enumerate(entries):
        gid = layout.group_of(entry.pg_name, dump.rank)
        if gid is None or gid not in wanted:
            continue
        end, source = _end_of(entry, entries[i + 1] if i + 1 < len(entries) else None, dump_time)
        start = entry.time_created_ns - shift
        slices.append(_Slice(start, max(start + _MIN_DRAWN_NS, end - shift), entry, gid, source))
    slices.sort(key=lambda s: (s.start, s.end, s.entry.index))
    return slices


def _assign_lanes(slices: list) -> list:
    """Lane of each slice within its group: the lowest-numbered lane whose last slice has
    ended when it starts (touching is fine), so no two slices of a lane overlap.

    Slices come ordered by start, so a lane that has ended stays free until it is taken
    again: per group, a heap of (end, lane) of busy lanes and a heap of free lane numbers
    give the same lanes as trying every lane in turn, in O(n log n) rather than O(n x lanes)
    (30,000 ops that never completed each open a lane: 41 s scanned, well under 1 s so)."""
    busy: dict = defaultdict(list)  # group id -> heap of (end, lane)
    free: dict = defaultdict(list)  # group id -> heap of lane numbers
    opened: dict = defaultdict(int)  # group id -> lanes opened so far
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


def _op_label(entry) -> str:
    if entry.is_p2p:
        # `send 0->1` says more than `send`; the peers are group-local ranks.
        label = entry.name.profiling_name.split(":", 1)[-1]
        return f"{label} p2p#{entry.p2p_seq_id}"
    return f"{entry.op} #{entry.collective_seq_id}"



class _Writer:
    """Turns ns into trace microseconds and events into JSON text on `out`."""

    def __init__(self, out, origin_ns: int):
        self.out = out
        self.origin = origin_ns
        self.first = True
        self.encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode
        self.shapes: dict = {}

    def us(self, ns: int) -> float:
        return (ns - self.origin + _TRUNCATION_GUARD_NS) / 1000.0

    def dur(self, ns: int) -> float:
        return (ns + _TRUNCATION_GUARD_NS) / 1000.0

    def shape_text(self, value: tuple) -> str:
        text = self.shapes.get(value)
        if text is None:
            text = self.shapes[value] = json.dumps(value, separators=(",", ":"))
        return text

    def emit(self, event: dict) -> None:
        self.out.write(("\n" if self.first else ",\n") + self.encode(event))
        self.first = False


def _metadata(pid: int, name: str, args: dict, tid: Optional[int] = None) -> dict:
    # "ph" leads: Perfetto's tokenizer looks for it (and "ts") before reading the rest.
    event = {"ph": "M", "pid": pid}
    if tid is not None:
        event["tid"] = tid
    event["name"] = name
    event["args"] = args
    return event


def _slice_event(w: _Writer, pid: int, tid: int, s: _Slice) -> dict:
    e = s.entry
    shapes = e.shapes
    # Group name and desc are on the track; the op is in the slice name and profiling_name.
    args = {
        "profiling_name": e.name.profiling_name,
        "collective_seq_id": e.collective_seq_id, "p2p_seq_id": e.p2p_seq_id, "op_id": e.op_id,
        "record_id": e.record_id, "state": e.state, "retired": e.retired,
        "input_sizes": w.shape_text(shapes.input_sizes), "input_dtypes": list(shapes.input_dtypes),
        "output_sizes": w.shape_text(shapes.output_sizes), "output_dtypes": list(shapes.output_dtypes),
        "time_created_ns": e.time_created_ns, "time_started_ns": e.time_started_ns,
        "time_completed_ns": e.time_completed_ns, "duration_ms": e.duration_ms, "timeout_ms": e.timeout_ms,
        "end": s.end_source,
    }
    site = call_site(e)
    if site:
        args["call_site"] = site
    return {
        "ph": "X", "ts": w.us(s.start), "dur": w.dur(s.end - s.start), "pid": pid, "tid": tid,
        "name": _op_label(e), "cat": "p2p" if e.is_p2p else "collective", "args": args,
    }


def _flow_pair(w: _Writer, flow_id: int, name: str, cat: str, source: tuple, target: tuple) -> Iterator[dict]:
    for ph, (pid, tid, at) in (("s", source), ("f", target)):
        yield {"ph": ph, "ts": w.us(at), "pid": pid, "tid": tid, "name": name, "cat": cat, "id": flow_id, "bp": "e"}


# --------------------------------------------------------------------------- plan


class _Plan:
    """What to draw and where: selections, clock offsets and the time origin."""

    def __init__(self, analysis, diagnosis, ranks: Optional[Iterable[int]], pg_filters: Iterable[str]):
        self.analysis = analysis
        self.diagnosis = diagnosis
        layout = analysis.layout
        self.layout = layout
        self.groups = {g.id: g for g in layout.groups}
        filters = set(pg_filters or ())
        self.wanted = {g.id for g in layout.groups if not filters or g.name in filters or g.desc in filters}
        selected = None if ranks is None else set(ranks)
        usable = layout.usable(analysis.load.dumps)
        self.dumps = [d for d in usable if selected is None or d.rank in selected]
        self.missing = [r for r in layout.ranks_missing if selected is None or r in selected]
        self.drawn = {d.rank for d in self.dumps}
        self.offsets = estimate_clock_offsets(analysis.matches.collectives)
        # Origin and end over the whole job, so a filtered trace keeps the same clock.
        starts, ends = [], []
        self.rank_last = {}
        for dump in usable:
            if not dump.entries:
                continue
            shift = _shift(self.offsets, dump.rank)
            starts.append(min(e.time_created_ns for e in dump.entries) - shift)
            self.rank_last[dump.rank] = _newest_ns(dump.entries) - shift
            ends.append(self.rank_last[dump.rank])
        self.origin = min(starts) if starts else 0
        self.end = max(ends) if ends else self.origin

    def aligned(self, rank: int, ns: int) -> int:
        return ns - _shift(self.offsets, rank)

    def not_issued_by_rank(self) -> dict:
        """rank -> CollectiveMatches (of wanted groups) its peers issued and it never did."""
        out = defaultdict(list)
        for match in self.analysis.matches.collectives:
            if match.group_id in self.wanted and match.calls:
                for rank in match.not_issued:
                    if rank in self.drawn:
                        out[rank].append(match)
        return out

    def other_data(self) -> dict:
        diagnosis = self.diagnosis
        return {
            "schema": SCHEMA_VERSION,
            "frtrace_version": __version__,
            "time_origin_ns": self.origin,
            "clock_alignment": {
                "aligned": bool(self.offsets),
                "method": "per rank: median over fully completed collectives of its completion time "
                          "minus the collective's median completion time; 0 without completion times",
                "offsets_us": {str(r): round(self.offsets.get(r, 0) / 1000.0, 3) for r in sorted(self.drawn)},
            },
            "status": diagnosis.status,
            "suspect_ranks": list(diagnosis.suspect_ranks),
            "verdict": diagnosis.verdict,
            "ranks": sorted(self.drawn | set(self.missing)),
            "groups": [_group_label(self.groups[g]) for g in sorted(self.wanted)],
        }


class _Tids:
    """Thread ids unique across the whole trace, assigned in (rank, group, lane)
    order: Perfetto names a thread by tid alone in metadata events."""

    def __init__(self, first: int):
        self.next = first

    def take(self) -> int:
        tid, self.next = self.next, self.next + 1
        return tid


def _track_name(group, lane: int) -> str:
    label = _group_label(group)
    if lane == _MARKER_LANE:
        return f"{label}: not issued"
    return label if lane == 0 else f"{label} +{lane}"


def _rank_tracks(slices: list, lanes: list, marker_groups: Iterable[int], groups: dict, tids: _Tids) -> dict:
    """(group id, lane) -> _Track for one rank. Markers get their own track: on a
    slice track, a zero-length marker would capture the flow arrows of the slice
    it lands in."""
    keys = {(s.group_id, lane) for s, lane in zip(slices, lanes)} | {(g, _MARKER_LANE) for g in marker_groups}
    return {(gid, lane): _Track(tids.take(), gid, lane, _track_name(groups[gid], lane)) for gid, lane in sorted(keys)}


def _rank_events(plan: _Plan, w: _Writer, dump, tids: _Tids, markers: list, anchors: dict) -> Iterator[dict]:
    """Metadata, slices and not-issued markers of one rank; fills `anchors` with
    (pid, tid, ns inside the slice) per entry index for the flow arrows."""
    rank, pid = dump.rank, dump.rank + 1
    slices = _rank_slices(dump, plan.layout, _shift(plan.offsets, rank), plan.wanted)
    lanes = _assign_lanes(slices)
    tracks = _rank_tracks(slices, lanes, {m.group_id for m in markers}, plan.groups, tids)
    yield _metadata(pid, "process_name", {"name": f"rank {rank}"})
    yield _metadata(pid, "process_sort_index", {"sort_index": rank})
    for track in tracks.values():
        yield _metadata(pid, "thread_name", {"name": track.name}, track.tid)
        yield _metadata(pid, "thread_sort_index", {"sort_index": track.tid}, track.tid)
    for s, lane in zip(slices, lanes):
        tid = tracks[(s.group_id, lane)].tid
        anchors[(rank, s.entry.index)] = (pid, tid, s.start + _MIN_DRAWN_NS // 2)
        yield _slice_event(w, pid, tid, s)
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


def _missing_rank_events(plan: _Plan, w: _Writer, rank: int) -> Iterator[dict]:
    pid = rank + 1
    yield _metadata(pid, "process_name", {"name": f"rank {rank} (no dump)"})
    yield _metadata(pid, "process_sort_index", {"sort_index": rank})
    yield {"ph": "i", "ts": w.us(plan.end), "pid": pid, "s": "p", "name": "NO DUMP", "cat": "missing_dump",
           "args": {"note": f"rank {rank} left no usable dump file"}}


def _flow_events(plan: _Plan, w: _Writer, anchors: dict) -> Iterator[dict]:
    """Collective chains in order of arrival, then send -> recv."""
    flow_id = 0
    for match in plan.analysis.matches.collectives:
        if match.group_id not in plan.wanted:
            continue
        ends = [anchors[(r, es[0].index)] for r, es in match.calls.items() if (r, es[0].index) in anchors]
        ends.sort(key=lambda a: (a[2], a[0]))
        name = f"{match.first_entry.op} #{match.seq}"
        for source, target in zip(ends, ends[1:]):
            flow_id += 1
            yield from _flow_pair(w, flow_id, name, "collective", source, target)
    for p2p in plan.analysis.matches.p2p:
        if p2p.group_id not in plan.wanted or p2p.send is None or p2p.recv is None:
            continue
        source, target = anchors.get((p2p.src, p2p.send.index)), anchors.get((p2p.dst, p2p.recv.index))
        if source and target:
            flow_id += 1
            yield from _flow_pair(w, flow_id, f"{p2p.send.op} {p2p.src}->{p2p.dst}", "p2p", source, target)


def _finding_time(plan: _Plan, finding, matches_by_key: dict) -> Optional[int]:
    """Aligned ns of the divergence: when the first rank entered the op."""
    match = matches_by_key.get((finding.group_id, finding.collective_seq_id))
    if match is not None and match.calls:
        return min(plan.aligned(r, es[0].time_created_ns) for r, es in match.calls.items())
    if finding.age_ns:
        holder = (finding.waiting_ranks or finding.ranks or (None,))[0]
        return plan.aligned(holder, finding.age_ns) if holder is not None else finding.age_ns
    return None


def _wanted_finding(plan: _Plan, finding, ranks_filtered: bool) -> bool:
    if finding.group_id is not None and finding.group_id not in plan.wanted:
        return False
    shown = plan.drawn | set(plan.missing)
    return not ranks_filtered or not finding.ranks or bool(set(finding.ranks) & shown)


def _finding_events(plan: _Plan, w: _Writer, ranks_filtered: bool) -> Iterator[dict]:
    matches_by_key = {(m.group_id, m.seq): m for m in plan.analysis.matches.collectives}
    some_pid = min(plan.drawn | set(plan.missing), default=0) + 1
    for finding in plan.diagnosis.findings:
        if not _wanted_finding(plan, finding, ranks_filtered):
            continue
        at = _finding_time(plan, finding, matches_by_key)
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
                else "when the first rank entered the op",
            },
        }


# --------------------------------------------------------------------------- writer


@contextlib.contextmanager
def _open_text(path: str, compress: bool):
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open(path, "wb"))
        if compress:
            # No file name or time in the gzip header: the same dumps give the same bytes.
            raw = stack.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6))
        # A name holding a lone surrogate (a JSON '\udcff' escape in a dump, or a file name
        # that is not UTF-8) cannot be UTF-8: written as that same escape, it is still
        # valid JSON and reads back as the name the dump held.
        yield stack.enter_context(io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", newline="\n",
                                                   write_through=False))


def write_timeline(path_tmp: str, analysis, diagnosis, ranks: Optional[Iterable[int]] = None,
                   pg_filters: Iterable[str] = (), *, compress: bool = False) -> None:
    """Write the trace-event JSON (gzip-compressed when `compress`) to `path_tmp`."""
    plan = _Plan(analysis, diagnosis, ranks, pg_filters)
    not_issued = plan.not_issued_by_rank()
    # Tids above every pid, so a track is never mistaken for a process's main thread.
    tids = _Tids(analysis.layout.world_size + 2)
    anchors: dict = {}
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
        for event in _finding_events(plan, w, ranks is not None):
            w.emit(event)
        out.write('\n],\n"displayTimeUnit":"ms",\n"otherData":' + json.dumps(plan.other_data(), default=str) + "}\n")
