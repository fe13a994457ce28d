"""Render a `Diagnosis` as text, JSON (schema `frtrace.report/1`) or markdown.

Takes the `Analysis` and its `Diagnosis`; returns a string. Pure functions: the same
inputs give byte-identical output (ranks and groups sorted, no timestamps of ours).
"""

from __future__ import annotations

import json
import operator
from collections import Counter, defaultdict
from datetime import datetime, timezone
from functools import cached_property
from importlib import resources
from itertools import compress
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

from frtrace._version import __version__
from frtrace.diagnosis import Diagnosis, Finding, kind, side_by_side
from frtrace.diagnosis.confidence import suspect_confidences
from frtrace.load.discovery import OTHER_GENERATION
from frtrace.load.forked import Forked
from frtrace.load.layout import Layout
from frtrace.match.analysis import Analysis
from frtrace.model import LoadIssue
from frtrace.report.json_text import indented_json
from frtrace.report.rank_view import (
    BLOCKED,
    IDLE,
    NO_DUMP,
    NO_ENTRIES,
    ClassKey,
    OpAt,
    RankStanding,
    RankView,
    StandingRow,
    group_classes,
    rank_standings,
    rank_view,
    sorted_names,
)
from frtrace.table.rank_dump import RankDump, clocks_compare
from frtrace.report.text_layout import Style, table_lines, wrap_line, wrap_lines
from frtrace.table.standing import only_active_job
from frtrace.util import fold_ranks, plural
from frtrace.wording import (
    group_label,
    groups_text,
    printable,
    ranks_text,
    seq_label,
    skipped_frames_text,
    span_text,
)

SCHEMA = "frtrace.report/1"
STATUS_WORD = {"healthy": "HEALTHY", "faults": "FAULT", "inconclusive": "INCONCLUSIVE"}


class ReportParts:
    """What every report reads of the analysis alone, whatever the diagnosis: the inputs,
    the match counts and where each rank stands. Each is worked out when first read and
    kept, so that the outputs of one run (the report, `--ranks`, `--html`) work it out
    once; `ready()` works them all out, which api.diagnose has done while forked rules
    run, or `work_out_apart` in a forked child of its own. Read, never changed: a report
    copies what it adds to."""

    def __init__(self, analysis: Analysis):
        self.analysis = analysis
        self._apart: Optional[Forked[_Parts]] = None  # a child working them out, until read back
        self._from_child: Optional[_Parts] = None

    @cached_property
    def inputs(self) -> dict[str, object]:
        done = self._worked_out_apart()
        return done.inputs if done is not None else _inputs(self.analysis)

    @cached_property
    def matched(self) -> dict[str, int]:
        done = self._worked_out_apart()
        return done.matched if done is not None else _match_counts(self.analysis)

    @cached_property
    def standings(self) -> list[RankStanding]:
        done = self._worked_out_apart()
        return done.standings if done is not None else rank_standings(self.analysis)

    @classmethod
    def of(cls, analysis: Analysis, parts: Optional[ReportParts] = None) -> ReportParts:
        """`parts` where they are this analysis's, else new ones (worked out when read)."""
        return parts if parts is not None and parts.analysis is analysis else cls(analysis)

    def ready(self) -> ReportParts:
        """These parts, each worked out."""
        _ = self.inputs, self.matched, self.standings
        return self

    def work_out_apart(self, processes: int) -> bool:
        """Start working these parts out in a forked child, where a large job has
        `processes` to spare (side_by_side.worth_forking): the main process sets the pace
        of a many-core run once the files are read, and these parts are some 0.3 s of its
        CPU at 4,096 ranks. Read back when first asked for,
        by the report (the child leaves its result in a file: see Forked.start_spilling);
        worked out here should the child fail. Whether a child was started."""
        if self._apart is None and side_by_side.worth_forking(self.analysis.load.dumps, processes):
            self._apart = Forked.try_start(_parts_of, self.analysis, spilling=True)
        return self._apart is not None

    def __del__(self) -> None:
        # Parts never read (a caller that wanted the verdict alone): no child left unreaped.
        child = getattr(self, "_apart", None)
        if child is not None:
            child.discard()

    def _worked_out_apart(self) -> Optional[_Parts]:
        """The child's parts (None: no child, or it failed), read back once."""
        if self._apart is not None:
            child, self._apart = self._apart, None
            self._from_child = child.result()
        return self._from_child

    def view(self, suspects: Iterable[int]) -> RankView:
        """The per-rank view with these `suspects` (rank_view)."""
        return rank_view(self.analysis, suspects, self.standings)


class _Parts(NamedTuple):
    """ReportParts' three parts, as a forked child sends them back."""

    inputs: dict[str, object]
    matched: dict[str, int]
    standings: list[RankStanding]


def _parts_of(analysis: Analysis) -> _Parts:
    return _Parts(_inputs(analysis), _match_counts(analysis), rank_standings(analysis))


def _inputs(analysis: Analysis) -> dict[str, object]:
    load, layout = analysis.load, analysis.layout
    dumps = layout.usable(load.dumps)
    return {
        "ranks_found": list(layout.ranks_found),
        "ranks_missing": list(layout.ranks_missing),
        "world_size": layout.world_size,
        "world_size_source": layout.world_source,
        "writers": sorted({d.writer for d in dumps}),
        "clock": _clock(dumps),
        "versions": sorted({d.version for d in dumps}),
        "backends": sorted({d.backend for d in dumps if d.backend}),
        "comm_lib_versions": sorted({d.comm_lib_version for d in dumps if d.comm_lib_version}),
        "encodings": sorted({d.encoding for d in dumps}),
        "file_prefix": load.prefix,
        "entries": sum(len(d.entries) for d in dumps),
        "ranks_wrapped": [] if only_active_job(dumps) else [d.rank for d in dumps if d.wrapped],
        "ranks_only_active": [d.rank for d in dumps if d.entries] if only_active_job(dumps) else [],
        "ranks_without_entries": [d.rank for d in dumps if not d.entries],
        "has_stack_traces": any(d.has_frames for d in dumps),
        "groups": [
            {"name": g.name, "desc": g.desc, "ranks": fold_ranks(g.ranks), "rank_list": sorted(g.ranks), "size": g.size,
             "membership_source": g.membership_source}
            for g in layout.groups
        ],
        # where each rank's dump was read from (host-qualified file names name the host)
        "dump_files": [{"rank": d.rank, "path": d.path} for d in sorted(dumps, key=lambda d: d.rank)],
        "unreadable_files": [{"path": e.path, "problem": e.problem} for e in _unusable_files(analysis)],
        "skipped_files": [{"path": s.path, "reason": s.problem} for s in load.skipped],
        "warnings": [{"rank": d.rank, "warning": w} for d in dumps for w in d.warnings]
        + [{"rank": rank, "warning": w} for rank, w in layout.warnings],
        # only when there are: what the loader noted (dumps of another incident left out and why)
        **({"notes": list(load.notes)} if load.notes else {}),
    }


def _clock(dumps: list[RankDump]) -> str:
    """What the dumps' times are on: "wall" (hosts' wall clocks), "cupti" (CUPTI's native
    clock, no converter given: not comparable across ranks), or "mixed"."""
    clocks = {d.clock for d in dumps}
    return clocks.pop() if len(clocks) == 1 else ("mixed" if clocks else "wall")


def _writer_notes(dumps: list[RankDump]) -> list[str]:
    """What the report's reader must know about dumps not written by c10d's Flight Recorder."""
    notes = []
    if any(d.writer == "cupti_monitor" for d in dumps):
        notes.append("Written by PyTorch's CUPTI comms monitor: it numbers each op type of a group on its own "
                     "(NCCL's counters), so each is lined up on its own (group/op); its pg_status, one for all "
                     "groups, is not read; its sends and receives name no peer, so none is paired.")
    if not clocks_compare(dumps):
        notes.append("Times are on CUPTI's own clock (the monitor was given no clock converter), which each host "
                     "counts from its own origin: nothing compares times across ranks (no straggler check, no "
                     "'since', findings not ordered by age).")
    return notes


def _unusable_files(analysis: Analysis) -> list[LoadIssue]:
    """Files the loader could not read, then those the builder set aside for their rank."""
    return list(analysis.load.errors) + list(analysis.layout.ignored_files)


def _finding_dict(finding: Finding) -> dict[str, object]:
    return {
        "kind": finding.kind,
        "rule": finding.rule,
        "severity": finding.severity,
        "root_cause": finding.is_root,
        "pg_name": finding.pg_name,
        "pg_desc": finding.pg_desc,
        "op": finding.op,
        "collective_seq_id": finding.collective_seq_id,
        "p2p_seq_id": finding.p2p_seq_id,
        "ranks": list(finding.ranks),
        "suspect_ranks": list(finding.suspect_ranks),
        "message": finding.message,
        "next_step": _next_step(finding),
        "evidence": finding.evidence,
    }


def _next_step(finding: Finding) -> Optional[str]:
    # A rule may word its kind's step for its evidence (a finding from logs has no -j to point at).
    template = finding.facts.get("next_step") or kind(finding.kind).next_step
    if not template or not finding.is_root or finding.severity == "info":
        return None
    # Point at the call site only where the finding shows one (a rank that never issued
    # the op has no entry of it, and dumps without stacks have none).
    call_site = "the suspect call site above, " if "suspect_call_site" in finding.evidence else ""
    step = template.format(suspects=fold_ranks(finding.suspect_ranks or finding.ranks), call_site=call_site)
    return step + _host_step(finding.evidence.get("suspect_hosts"))


def _host_step(hosts: Optional[dict[str, str]]) -> str:
    """Where the inputs say which host a suspect ran on (logs, host-named files): name it."""
    if not hosts:
        return ""
    names = sorted(set(hosts.values()))
    where = ", ".join(f"rank {rank} on {host}" for rank, host in list(hosts.items())[:6]) + (", ..." if len(hosts) > 6 else "")
    return f"; {where}: if the machine is at fault, drain {'node' if len(names) == 1 else 'nodes'} {', '.join(names[:6])}"


def _confidence_json(analysis: Analysis, diagnosis: Diagnosis) -> list[dict[str, object]]:
    """Per primary suspect: how far the blame can be trusted, and on what (diagnosis/confidence.py)."""
    return [{
        "rank": c.rank,
        "confidence": c.confidence,
        "evidence": list(c.evidence),
        "finding": {"kind": c.finding.kind, "rule": c.finding.rule, "pg_name": c.finding.pg_name,
                    "collective_seq_id": c.finding.collective_seq_id, "p2p_seq_id": c.finding.p2p_seq_id},
    } for c in suspect_confidences(diagnosis, analysis.layout.ranks_missing)]


def _confidence_text(analysis: Analysis, diagnosis: Diagnosis) -> str:
    """` (confidence 0.95: unanimous peers)` for the suspect line; a range when suspects differ."""
    scores = suspect_confidences(diagnosis, analysis.layout.ranks_missing)
    if not scores:
        return ""
    low, high = min(c.confidence for c in scores), max(c.confidence for c in scores)
    if low != high:
        return f" (confidence {low:.2f}-{high:.2f})"
    return f" (confidence {low:.2f}: {scores[0].evidence[0].replace('_', ' ')})"


def report_dict(analysis: Analysis, diagnosis: Diagnosis, parts: Optional[ReportParts] = None) -> dict[str, Any]:
    """The JSON report as Python data: JSON values of every kind, read by key (render_with_logs adds to it;
    `parts`: see ReportParts)."""
    parts = ReportParts.of(analysis, parts)
    view = parts.view(diagnosis.suspect_ranks)
    return {
        "schema": SCHEMA,
        "frtrace_version": __version__,
        "newest_entry_utc": utc_text(view.newest_created_ns),
        "status": diagnosis.status,
        "suspect_ranks": list(diagnosis.suspect_ranks),
        "suspect_confidence": _confidence_json(analysis, diagnosis),
        "summary": diagnosis.verdict,
        "inputs": dict(parts.inputs),
        "matched": dict(parts.matched),
        "findings": [_finding_dict(f) for f in diagnosis.findings],
        "ranks": ranks_json(view),
    }


def utc_text(ns: Optional[int]) -> Optional[str]:
    """`2025-10-20T22:40:08.801Z` (ISO 8601, UTC, milliseconds) for a wall clock in ns."""
    if ns is None:
        return None
    seconds, rest = divmod(ns, 10**9)
    try:
        stamp = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a clock no calendar holds (a dump's odd value)
        return None
    return f"{stamp}.{rest // 10**6:03d}Z"


def report_schema() -> dict[str, Any]:
    """The JSON Schema of `--format json` (shipped as frtrace/report/schema/report.schema.json)."""
    text = resources.files("frtrace.report").joinpath("schema").joinpath("report.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)  # a JSON Schema is a JSON object
    return schema


def _match_counts(analysis: Analysis) -> dict[str, int]:
    collectives = analysis.matches.collectives
    # Most of a job's collectives agree, with every member there: the others are picked
    # out in C (any of a disagreement, members that did not issue it, members without a
    # dump), and only those are looked at one by one.
    odd = list(compress(collectives, map(any, map(_NOT_AGREED, collectives))))
    mismatched = sum(1 for match in odd if match.disagreement is not None)
    p2p_paired = sum(map(_PAIRED, analysis.matches.p2p))
    return {
        "collectives": len(collectives),
        "collectives_agreed": len(collectives) - len(odd),
        "collectives_partial": len(odd) - mismatched,
        "collectives_mismatched": mismatched,
        "p2p_pairs": p2p_paired,
        "p2p_unpaired": len(analysis.matches.p2p) - p2p_paired,
    }


_NOT_AGREED = operator.attrgetter("disagreement", "not_issued", "no_dump")
_PAIRED = operator.attrgetter("paired")


def render_json(analysis: Analysis, diagnosis: Diagnosis, parts: Optional[ReportParts] = None) -> str:
    return indented_json(report_dict(analysis, diagnosis, parts)) + "\n"


# --------------------------------------------------------------------------- where each rank is

# The text report shows this many rows of the per-rank view; `--ranks` shows them all.
RANK_ROWS_IN_REPORT = 12
# ... or fewer, while the report would be longer than a screen of SCREEN_LINES, down to
# RANK_ROWS_AT_LEAST (rows with a suspect come first).
SCREEN_LINES = 60
RANK_ROWS_AT_LEAST = 3
RANK_HEADERS = ("ranks", "count", "blocked in", "state", "since", "last {done}", "behind its peers")


def _op_json(op: Optional[OpAt], groups: tuple[str, ...]) -> Optional[dict[str, object]]:
    if op is None:
        return None
    return {"op": op.op, "pg_desc": op.pg_desc, "pg_names": list(groups), "collective_seq_id": op.collective_seq_id,
            "p2p_seq_id": op.p2p_seq_id, "state": op.state}


def ranks_json(view: RankView) -> list[dict[str, object]]:
    """The JSON report's `ranks`: one object per folded row (ranks as `0-11,13-15`), not per rank."""
    return [{
        "ranks": fold_ranks(row.ranks),
        "rank_list": list(row.ranks),
        "count": len(row.ranks),
        "standing": row.standing,
        "suspect": row.suspect,
        "blocked_in": _op_json(row.blocked_in, row.blocked_groups),
        "since_ms": None if row.since_ns is None else [round(row.since_ns[0] / 1e6, 3), round(row.since_ns[1] / 1e6, 3)],
        "last_completed": _op_json(row.last_completed, row.last_completed_groups),
        "behind": [{"pg_desc": c.desc, "pg_names": list(names), "collectives": lag} for c, lag, names in row.behind],
    } for row in view.rows]


def op_at_text(op: OpAt, groups: tuple[str, ...], most_ranges: Optional[int] = None) -> str:
    """`all_reduce #4 in group 0 (default_pg)`, or `... in groups 1-4 (tp)` for a folded row."""
    return f"{op.op} {seq_label(op.collective_seq_id, op.p2p_seq_id)} in {groups_text(groups, op.pg_desc, most_ranges)}"


def rank_row_cells(row: StandingRow, view: RankView, most_ranges: Optional[int] = None) -> tuple[str, ...]:
    """The per-rank view's row as strings (unescaped), in RANK_HEADERS order; with
    `most_ranges`, group lists of more ranges than that are counted (see groups_text)."""
    if row.standing == BLOCKED:
        assert row.blocked_in is not None  # a blocked row says what it is blocked in
        where, state = op_at_text(row.blocked_in, row.blocked_groups, most_ranges), row.blocked_in.state
        since = span_text(*row.since_ns) if row.since_ns else "unknown"
    else:
        where = {IDLE: f"nothing: every op it holds {view.completion_word}", NO_ENTRIES: "(its dump holds no entries)",
                 NO_DUMP: "(no dump)"}[row.standing]
        state = since = ""
    last = op_at_text(row.last_completed, row.last_completed_groups, most_ranges) if row.last_completed else ""
    behind = "; ".join(f"{plural(lag, 'collective')} in {groups_text(names, c.desc, most_ranges)}"
                       for c, lag, names in row.behind)
    ranks = fold_ranks(row.ranks) + (" *" if row.suspect else "")
    return ranks, str(len(row.ranks)), where, state, since, last, behind


def rank_headers(view: RankView) -> tuple[str, ...]:
    return tuple(h.format(done=view.completion_word) for h in RANK_HEADERS)


def rank_view_notes(view: RankView) -> list[str]:
    """What the reader needs to read the per-rank view right."""
    notes = ["since: how long before the newest op created anywhere in the job (hosts' clocks may differ); "
             "behind: collectives short of the newest a peer in the group issued; * a suspect."]
    if view.completion_word == "retired":
        notes.append("These dumps do not say when ops finished (gloo): retired ops include ops that timed out.")
    return notes


def render_rank_view(analysis: Analysis, diagnosis: Diagnosis, limit: Optional[int] = None,
                     style: Optional[Style] = None, width: Optional[int] = None,
                     parts: Optional[ReportParts] = None) -> str:
    """The per-rank view as text: the verdict, then one row per class of ranks (at most
    `limit`, with a note of how many more), in lines of at most `width` columns."""
    style = style or (lambda text, **_: text)
    view = ReportParts.of(analysis, parts).view(diagnosis.suspect_ranks)
    lines = [style(line, bold=True) for line in wrap_line(printable(diagnosis.verdict), width)] + [""]
    lines += _rank_view_lines(view, limit, width)
    return "\n".join(lines).rstrip() + "\n"


def _rank_view_lines(view: RankView, limit: Optional[int], width: Optional[int] = None,
                     max_lines: Optional[int] = None) -> list[str]:
    """The per-rank view's lines. With a `limit` (the report, not --ranks) a row's rank list
    is cut short too (its count says how many), and rows are left out, from the last, while
    the view takes more than `max_lines` (down to RANK_ROWS_AT_LEAST)."""
    count = len(view.rows) if limit is None else min(limit, len(view.rows))
    while True:
        lines = _rank_view_rows(view, count, limit is not None, width)
        if max_lines is None or len(lines) <= max_lines or count <= min(RANK_ROWS_AT_LEAST, len(view.rows)):
            return lines
        count -= 1


def _rank_view_rows(view: RankView, count: int, short: bool, width: Optional[int]) -> list[str]:
    shown = view.rows[:count]
    most_ranges = GROUP_RANGES_IN_REPORT if short else None
    cells = [tuple(map(printable, rank_row_cells(row, view, most_ranges))) for row in shown]
    if short:
        cells = [(_short_list(row[0]),) + row[1:] for row in cells]
    lines = wrap_line(f"Where each rank is ({plural(view.rank_count, 'rank')} in {plural(len(view.rows), 'row')})", width)
    lines += table_lines(rank_headers(view), cells, width)
    notes: list[str] = []
    if len(shown) < len(view.rows):
        notes.append(f"  ... {plural(len(view.rows) - len(shown), 'more row')} (frtrace --ranks shows them all)")
    notes += ["  " + note for note in rank_view_notes(view)]
    return lines + wrap_lines(notes, width)


# A folded rank list in the report's per-rank table is cut after this many characters,
# and a list of groups folding into more ranges than this is counted instead.
RANK_LIST_CHARS = 24
GROUP_RANGES_IN_REPORT = 2


def _short_list(ranks: str) -> str:
    """`13,21,29,37,45,…`: a folded list cut at a comma before RANK_LIST_CHARS (a `*` kept)."""
    text, star = (ranks[:-2], " *") if ranks.endswith(" *") else (ranks, "")
    if len(text) <= RANK_LIST_CHARS:
        return ranks
    cut = text.rfind(",", 0, RANK_LIST_CHARS)
    return (text[:cut] if cut > 0 else text[:RANK_LIST_CHARS]) + ",…" + star


# --------------------------------------------------------------------------- text


# A text report is laid out in this many columns when stdout is no terminal.
DEFAULT_WIDTH = 100


def _finding_lines(finding: Finding, bullet: str = "  - ", verbose: bool = False) -> list[str]:
    label = finding.kind if finding.is_root else f"{finding.kind}, consequence"
    lines = [f"{bullet}[{finding.severity}: {label}] {finding.message}"]
    pad = " " * len(bullet)
    evidence = finding.evidence
    for cls in evidence.get("classes", []):
        lines.append(f"{pad}  {ranks_text(cls['ranks'])}: {cls['entry']}")
    if "suspect_call_site" in evidence:
        lines.append(f"{pad}  suspect call site: {evidence['suspect_call_site']}")
        lines += _skipped_frames_lines(finding, "suspect_call_site", pad, verbose)
    if "peer_call_site" in evidence:
        lines.append(f"{pad}  peer call site:    {evidence['peer_call_site']}")
        lines += _skipped_frames_lines(finding, "peer_call_site", pad, verbose)
    for rank, past in sorted(evidence.get("went_past", {}).items(), key=lambda kv: int(kv[0])):
        if past.get("call_site"):
            lines.append(f"{pad}  rank {rank} went on at: {past['call_site']}")
    step = _next_step(finding)
    if step:
        lines.append(f"{pad}  next step: {step}")
    if verbose:
        lines.append(f"{pad}  rule: {finding.rule}")
    return lines


def _skipped_frames_lines(finding: Finding, key: str, pad: str, verbose: bool) -> list[str]:
    """With -v: the frames passed over to reach a call site (torch's, the standard library's ...)."""
    skipped = skipped_frames_text(finding.call_entries.get(key)) if verbose else None
    return [f"{pad}    frames skipped above it: {skipped}"] if skipped else []


def _group_heading(finding: Finding) -> str:
    if finding.group_id is None:
        return "Job-wide"
    return f"Group {group_label(finding.pg_name, finding.pg_desc)}"


def render_text(analysis: Analysis, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None,
                style: Optional[Style] = None, verbose: bool = False, width: Optional[int] = DEFAULT_WIDTH,
                show_all: bool = False, parts: Optional[ReportParts] = None) -> str:
    """One screen at any job size: the verdict, every root finding (grouped by group), the
    consequences folded into one line per class of groups, where each rank is (at most
    RANK_ROWS_IN_REPORT rows, fewer while the report is longer than SCREEN_LINES), what was read; every line at most `width` columns (None:
    unlimited), wrapped. `show_all` (or `verbose`, which also names each finding's rule
    and the frames skipped to reach its call sites) lists every finding and row instead.
    `parts`: see ReportParts."""
    style = style or (lambda text, **_: text)
    everything = verbose or show_all
    colour = {"healthy": "green", "faults": "red", "inconclusive": "yellow"}[diagnosis.status]
    lines: list[str] = []

    def add(text: str, fg: Optional[str] = None, bold: Optional[bool] = None) -> None:
        # Wrapped, then styled a line at a time.
        plain = fg is None and bold is None
        lines.extend(piece if plain else style(piece, fg=fg, bold=bold) for piece in wrap_line(printable(text), width))

    add(diagnosis.verdict, fg=colour, bold=True)
    if diagnosis.suspect_ranks:
        add(f"Suspect ranks: {fold_ranks(diagnosis.suspect_ranks)}{_confidence_text(analysis, diagnosis)}")
    lines.append("")
    listed = [f for f in diagnosis.findings if everything or f.is_root]
    by_heading: defaultdict[str, list[Finding]] = defaultdict(list)
    for finding in listed:
        by_heading[_group_heading(finding)].append(finding)
    for heading, findings in by_heading.items():
        add(heading, bold=True)
        shown = findings if mismatch_cap is None else findings[:mismatch_cap]
        for finding in shown:
            for line in _finding_lines(finding, verbose=verbose):
                add(line)
        if len(shown) < len(findings):
            add(f"  ... {len(findings) - len(shown)} more (raise --mismatch-cap to see them)")
        lines.append("")
    folded = [] if everything else [f for f in diagnosis.findings if not f.is_root]
    if folded:
        heading, *classes = consequence_lines(analysis, folded, len(listed))
        add(heading, bold=True)
        for line in classes:
            add(line)
        lines.append("")
    parts = ReportParts.of(analysis, parts)
    loaded = wrap_lines([printable(part) for part in _loaded_parts(analysis, parts.matched)], width)
    view = parts.view(diagnosis.suspect_ranks)
    if everything:
        lines += _rank_view_lines(view, None, width)
    else:
        lines += _rank_view_lines(view, RANK_ROWS_IN_REPORT, width, SCREEN_LINES - len(lines) - len(loaded) - 1)
    lines.append("")
    lines += loaded
    return "\n".join(lines).rstrip() + "\n"


def _world_size_note(layout: Layout) -> str:
    """Where the job's size is not what a dump says (gloo's pg_config lists no ranks), how it was found."""
    if layout.world_source == "files":
        return (f"World size {layout.world_size} is taken from the file names (the dumps' pg_config lists no ranks): "
                f"a rank above {layout.world_size - 1} that left no dump would not show (--world-size N says the size).")
    if layout.world_source == "group_shapes":
        beyond = [r for r in layout.ranks_missing if r > max(layout.ranks_found, default=-1)]
        return (f"World size {layout.world_size} comes from the groups' shapes (the dumps' pg_config lists no ranks): "
                f"sibling groups are short of {ranks_text(beyond)}, which left no dump.")
    return ""


# Op names a folded line of consequences spells out before "and N more".
OPS_PER_FOLDED_LINE = 3


class _FoldedClass(NamedTuple):
    """The consequences in one class of groups, as one line says them."""

    desc: str
    names: set[str]  # of the groups
    kinds: Counter[str]  # finding kind -> how many
    ops: dict[str, None]  # `all_reduce #12`, in the order first met
    order: int  # of the class: lines follow it


def consequence_lines(analysis: Analysis, consequences: list[Finding], roots: int,
                      listed_by: Optional[str] = "--all") -> list[str]:
    """A heading (saying that `listed_by` lists each), then one line per class of groups
    (the TP groups, the DP groups ...): its groups, how many consequences of each kind,
    and at which ops (unescaped)."""
    classes = group_classes(analysis)
    folded: dict[Union[ClassKey, tuple[str]], _FoldedClass] = {}  # class key (("job",): job-wide) -> its line
    for finding in consequences:
        group_class = classes.get(finding.group_id) if finding.group_id is not None else None
        key = group_class.key if group_class else ("job",)
        row = folded.setdefault(key, _FoldedClass(finding.pg_desc, set(), Counter(), {},
                                                  group_class.order if group_class else len(classes)))
        if finding.group_id is not None:
            row.names.add(finding.pg_name)
        row.kinds[finding.kind] += 1
        if finding.op:
            row.ops.setdefault(f"{finding.op} {seq_label(finding.collective_seq_id, finding.p2p_seq_id)}", None)
    groups = sum(len(row.names) for row in folded.values())
    lines = [f"Consequences of the root cause{'s' if roots > 1 else ''}: {plural(len(consequences), 'finding')} "
             f"in {plural(groups, 'other group')}" + (f" ({listed_by} lists each)" if listed_by else "")]
    for desc, names, kinds, ops, _order in sorted(folded.values(), key=lambda row: row.order):
        where = groups_text(sorted_names(names), desc) if names else "job-wide"
        what = ", ".join(f"{count} {kind_name}" for kind_name, count in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        shown = list(ops)[:OPS_PER_FOLDED_LINE]
        if len(ops) > len(shown):
            shown.append(f"{len(ops) - len(shown)} more")
        lines.append(f"  - {where}: {what}" + (f" at {', '.join(shown)}" if shown else ""))
    return lines


def _loaded_line(analysis: Analysis, counts: dict[str, int]) -> str:
    return "\n".join(_loaded_parts(analysis, counts))


def _loaded_parts(analysis: Analysis, counts: dict[str, int]) -> list[str]:
    """What was read, a sentence per line (unescaped: dump versions and file names)."""
    load, layout = analysis.load, analysis.layout
    dumps = layout.usable(load.dumps)
    backends = sorted({d.backend for d in dumps if d.backend}) or ["unknown backend"]
    versions = sorted({d.version for d in dumps})
    parts = [
        f"Read {plural(len(dumps), 'dump')} ({', '.join(backends)}, version {', '.join(versions)}) "
        f"of a {layout.world_size}-rank job: {plural(sum(len(d.entries) for d in dumps), 'entry', 'entries')}, "
        f"{plural(len(layout.groups), 'group')}, {plural(counts['collectives'], 'collective')} "
        f"({counts['collectives_agreed']} agreed, {counts['collectives_partial']} partial, {counts['collectives_mismatched']} mismatched), "
        f"{plural(counts['p2p_pairs'], 'P2P pair')}."
    ]
    if layout.ranks_missing:
        parts.append(f"No usable dump for {ranks_text(layout.ranks_missing)}.")
    world_note = _world_size_note(layout)
    if world_note:
        parts.append(world_note)
    parts += _writer_notes(dumps)
    only_active = [d.rank for d in dumps if d.entries] if only_active_job(dumps) else []
    wrapped = [] if only_active else [d.rank for d in dumps if d.wrapped]
    if wrapped:
        parts.append(f"Ring buffer wrapped on {ranks_text(wrapped)}: only the overlap of windows was compared.")
    if only_active:
        parts.append(f"Only active entries dumped on {ranks_text(only_active)} (onlyActive): finished ops are left out, "
                     "and pg_status says how far each group got.")
    unusable = _unusable_files(analysis)
    if unusable:
        parts.append(f"Skipped {plural(len(unusable), 'unusable file')}: " + "; ".join(str(e) for e in unusable[:5]))
    # What the loader noted: dumps of another incident left out and why, names listed twice.
    parts += [note[:1].upper() + note[1:] + ("" if note.endswith(".") else ".") for note in load.notes]
    unrelated = [s for s in load.skipped if not s.problem.startswith(OTHER_GENERATION)]
    if unrelated:
        parts.append(f"Ignored {plural(len(unrelated), 'unrelated file')}.")
    return parts



# --------------------------------------------------------------------------- markdown

# What dump-derived text may not carry into markdown: table cell breaks, code spans,
# emphasis, links and images, raw HTML (and entities that would spell it), line breaks.
_MARKDOWN_ESCAPES = str.maketrans({
    "\\": "\\\\", "`": "\\`", "|": "\\|", "*": "\\*", "~": "\\~", "[": "\\[", "]": "\\]",
    "&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": " ", "\r": " ", "\t": " ",
})


_LINE_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\t": " "})


def markdown_text(text: object) -> str:
    """`text` as literal markdown: no markup, HTML, image or line break of its own survives;
    other control and bidi characters are shown as escapes (`wording.printable`)."""
    return printable(str(text).translate(_LINE_BREAKS)).translate(_MARKDOWN_ESCAPES)


def _markdown_row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(markdown_text(cell) if cell != "" else "-" for cell in cells) + " |"


def _markdown_table(headers: Sequence[str], rows: Iterable[Iterable[object]]) -> list[str]:
    return [_markdown_row(headers), "|" + "---|" * len(headers)] + [_markdown_row(row) for row in rows]


def finding_details(finding: Finding) -> list[tuple[str, str]]:
    """(label, text) pairs that say where a finding's ops were called and what to do
    next: the call sites from its evidence and its next step (unescaped)."""
    evidence = finding.evidence
    details: list[tuple[str, str]] = []
    if "suspect_call_site" in evidence:
        details.append(("suspect call site", evidence["suspect_call_site"]))
    if "peer_call_site" in evidence:
        details.append(("peer call site", evidence["peer_call_site"]))
    for rank, past in sorted(evidence.get("went_past", {}).items(), key=lambda kv: int(kv[0])):
        if past.get("call_site"):
            details.append((f"rank {rank} went on at", past["call_site"]))
    step = _next_step(finding)
    if step:
        details.append(("next step", step))
    return details


def render_markdown(analysis: Analysis, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None,
                    parts: Optional[ReportParts] = None) -> str:
    """For an incident ticket: the verdict on the first line, then the suspects, the
    findings, each root finding's call sites and next step, and where each rank is.
    Every dump-derived string is escaped (see markdown_text)."""
    lines = [f"### {markdown_text(diagnosis.verdict)}", ""]
    if diagnosis.suspect_ranks:
        lines += [f"Suspect ranks: **{fold_ranks(diagnosis.suspect_ranks)}**", ""]
    if diagnosis.findings:
        rows: list[tuple[str, ...]] = []
        per_group: Counter[Optional[int]] = Counter()
        for finding in diagnosis.findings:
            per_group[finding.group_id] += 1
            if mismatch_cap is not None and per_group[finding.group_id] > mismatch_cap:
                continue
            seq = finding.collective_seq_id if finding.collective_seq_id is not None else finding.p2p_seq_id
            rows.append((finding.severity, finding.kind + ("" if finding.is_root else " (consequence)"),
                         group_label(finding.pg_name, finding.pg_desc) if finding.group_id is not None else "",
                         finding.op or "", "" if seq is None else str(seq), fold_ranks(finding.suspect_ranks),
                         finding.message))
        lines += _markdown_table(("severity", "kind", "group", "op", "seq", "suspects", "what"), rows) + [""]
        roots = [f for f in diagnosis.findings if f.is_root and finding_details(f)]
        if roots:
            lines += ["#### Where it was called, and what to do next", ""]
        for finding in roots:
            lines.append(f"- **{markdown_text(finding.kind)}**: {markdown_text(finding.message)}")
            lines += [f"  - {label}: {markdown_text(text)}" for label, text in finding_details(finding)]
        if roots:
            lines.append("")
    parts = ReportParts.of(analysis, parts)
    lines += _rank_view_markdown(parts.view(diagnosis.suspect_ranks), RANK_ROWS_IN_REPORT)
    lines += ["<details><summary>Inputs</summary>", "", markdown_text(_loaded_line(analysis, parts.matched)), "",
              "</details>", ""]
    return "\n".join(lines)


def _rank_view_markdown(view: RankView, limit: Optional[int]) -> list[str]:
    shown = view.rows if limit is None else view.rows[:limit]
    lines = [f"#### Where each rank is ({plural(view.rank_count, 'rank')} in {plural(len(view.rows), 'row')})", ""]
    lines += _markdown_table(rank_headers(view), [rank_row_cells(row, view) for row in shown])
    if len(shown) < len(view.rows):
        lines += ["", f"... {plural(len(view.rows) - len(shown), 'more row')} (frtrace --ranks --format markdown shows them all)"]
    lines += [""] + [markdown_text(note) for note in rank_view_notes(view)] + [""]
    return lines


def render_rank_view_markdown(analysis: Analysis, diagnosis: Diagnosis, style: Optional[Style] = None,
                              width: Optional[int] = None, parts: Optional[ReportParts] = None) -> str:
    """`--ranks --format markdown`: the verdict, then every row of the per-rank view."""
    view = ReportParts.of(analysis, parts).view(diagnosis.suspect_ranks)
    return "\n".join([f"### {markdown_text(diagnosis.verdict)}", ""] + _rank_view_markdown(view, None)).rstrip() + "\n"


def render_rank_view_json(analysis: Analysis, diagnosis: Diagnosis, style: Optional[Style] = None,
                          width: Optional[int] = None, parts: Optional[ReportParts] = None) -> str:
    """`--ranks --format json`: the report's status, suspects, summary and `ranks` only."""
    view = ReportParts.of(analysis, parts).view(diagnosis.suspect_ranks)
    report = {"schema": SCHEMA, "frtrace_version": __version__, "newest_entry_utc": utc_text(view.newest_created_ns),
              "status": diagnosis.status, "suspect_ranks": list(diagnosis.suspect_ranks),
              "summary": diagnosis.verdict, "ranks": ranks_json(view)}
    return indented_json(report) + "\n"


def render_suspect_ranks(analysis: Analysis, diagnosis: Diagnosis, style: Optional[Style] = None,
                         width: Optional[int] = None, parts: Optional[ReportParts] = None) -> str:
    """`--format ranks`, for alert scripts: the primary suspects' ranks on one line, separated
    by spaces (an empty line when there is none); the exit code says the status."""
    return " ".join(map(str, diagnosis.suspect_ranks)) + "\n"


# `--ranks`: the per-rank view alone, by --format
RANK_VIEW_RENDERERS = {"text": render_rank_view, "json": render_rank_view_json, "markdown": render_rank_view_markdown,
                       "ranks": render_suspect_ranks}
