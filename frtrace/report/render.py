"""Render a `Diagnosis` as text, JSON (schema `frtrace.report/1`) or markdown.

Takes the `Analysis` and its `Diagnosis`; returns a string. Pure functions: the same
inputs give byte-identical output (ranks and groups sorted, no timestamps of ours).
"""

from __future__ import annotations

import json
import operator
from collections import Counter, defaultdict
from itertools import compress
from typing import Optional

from tabulate import tabulate

from frtrace.diagnosis import Diagnosis, Finding, kind
from frtrace.load.discovery import OTHER_GENERATION
from frtrace.match.analysis import Analysis
from frtrace.report.rank_view import (
    BLOCKED,
    IDLE,
    NO_DUMP,
    NO_ENTRIES,
    OpAt,
    RankView,
    StandingRow,
    rank_view,
)
from frtrace.table.standing import only_active_job
from frtrace.util import fold_ranks, plural
from frtrace.wording import group_label, groups_text, printable, ranks_text, seq_label, span_text

SCHEMA = "frtrace.report/1"
STATUS_WORD = {"healthy": "HEALTHY", "faults": "FAULT", "inconclusive": "INCONCLUSIVE"}


def _inputs(analysis: Analysis) -> dict:
    load, layout = analysis.load, analysis.layout
    dumps = layout.usable(load.dumps)
    return {
        "ranks_found": list(layout.ranks_found),
        "ranks_missing": list(layout.ranks_missing),
        "world_size": layout.world_size,
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
            {"name": g.name, "desc": g.desc, "ranks": fold_ranks(g.ranks), "size": g.size, "membership_source": g.membership_source}
            for g in layout.groups
        ],
        "unreadable_files": [{"path": e.path, "problem": e.problem} for e in _unusable_files(analysis)],
        "skipped_files": [{"path": s.path, "reason": s.problem} for s in load.skipped],
        "warnings": [{"rank": d.rank, "warning": w} for d in dumps for w in d.warnings]
        + [{"rank": rank, "warning": w} for rank, w in layout.warnings],
        # only when there are: what the loader noted (dumps of another incident left out and why)
        **({"notes": list(load.notes)} if load.notes else {}),
    }


def _unusable_files(analysis: Analysis) -> list:
    """Files the loader could not read, then those the builder set aside for their rank."""
    return list(analysis.load.errors) + list(analysis.layout.ignored_files)


def _finding_dict(finding: Finding) -> dict:
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
    template = kind(finding.kind).next_step
    if not template or not finding.is_root or finding.severity == "info":
        return None
    # Point at the call site only where the finding shows one (a rank that never issued
    # the op has no entry of it, and dumps without stacks have none).
    call_site = "the suspect call site above, " if "suspect_call_site" in finding.evidence else ""
    return template.format(suspects=fold_ranks(finding.suspect_ranks or finding.ranks), call_site=call_site)


def report_dict(analysis: Analysis, diagnosis: Diagnosis) -> dict:
    return {
        "schema": SCHEMA,
        "status": diagnosis.status,
        "suspect_ranks": list(diagnosis.suspect_ranks),
        "summary": diagnosis.verdict,
        "inputs": _inputs(analysis),
        "matched": _match_counts(analysis),
        "findings": [_finding_dict(f) for f in diagnosis.findings],
        "ranks": ranks_json(rank_view(analysis, diagnosis.suspect_ranks)),
    }


def _match_counts(analysis: Analysis) -> dict:
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


def render_json(analysis: Analysis, diagnosis: Diagnosis) -> str:
    return json.dumps(report_dict(analysis, diagnosis), indent=2, sort_keys=True) + "\n"


# --------------------------------------------------------------------------- where each rank is

# The text report shows this many rows of the per-rank view; `--ranks` shows them all.
RANK_ROWS_IN_REPORT = 12
RANK_HEADERS = ("ranks", "count", "blocked in", "state", "since", "last {done}", "behind its peers")


def _op_json(op: Optional[OpAt], groups: tuple) -> Optional[dict]:
    if op is None:
        return None
    return {"op": op.op, "pg_desc": op.pg_desc, "pg_names": list(groups), "collective_seq_id": op.collective_seq_id,
            "p2p_seq_id": op.p2p_seq_id, "state": op.state}


def ranks_json(view: RankView) -> list:
    """The JSON report's `ranks`: one object per folded row (ranks as `0-11,13-15`), not per rank."""
    return [{
        "ranks": fold_ranks(row.ranks),
        "count": len(row.ranks),
        "standing": row.standing,
        "suspect": row.suspect,
        "blocked_in": _op_json(row.blocked_in, row.blocked_groups),
        "since_ms": None if row.since_ns is None else [round(row.since_ns[0] / 1e6, 3), round(row.since_ns[1] / 1e6, 3)],
        "last_completed": _op_json(row.last_completed, row.last_completed_groups),
        "behind": [{"pg_desc": c.desc, "pg_names": list(names), "collectives": lag} for c, lag, names in row.behind],
    } for row in view.rows]


def op_at_text(op: OpAt, groups: tuple) -> str:
    """`all_reduce #4 in group 0 (default_pg)`, or `... in groups 1-4 (tp)` for a folded row."""
    return f"{op.op} {seq_label(op.collective_seq_id, op.p2p_seq_id)} in {groups_text(groups, op.pg_desc)}"


def rank_row_cells(row: StandingRow, view: RankView) -> tuple:
    """The per-rank view's row as strings (unescaped), in RANK_HEADERS order."""
    if row.standing == BLOCKED:
        assert row.blocked_in is not None  # a blocked row says what it is blocked in
        where, state = op_at_text(row.blocked_in, row.blocked_groups), row.blocked_in.state
        since = span_text(*row.since_ns) if row.since_ns else "unknown"
    else:
        where = {IDLE: f"nothing: every op it holds {view.completion_word}", NO_ENTRIES: "(its dump holds no entries)",
                 NO_DUMP: "(no dump)"}[row.standing]
        state = since = ""
    last = op_at_text(row.last_completed, row.last_completed_groups) if row.last_completed else ""
    behind = "; ".join(f"{plural(lag, 'collective')} in {groups_text(names, c.desc)}" for c, lag, names in row.behind)
    ranks = fold_ranks(row.ranks) + (" *" if row.suspect else "")
    return ranks, str(len(row.ranks)), where, state, since, last, behind


def rank_headers(view: RankView) -> tuple:
    return tuple(h.format(done=view.completion_word) for h in RANK_HEADERS)


def rank_view_notes(view: RankView) -> list:
    """What the reader needs to read the per-rank view right."""
    notes = ["since: how long before the newest op created anywhere in the job (hosts' clocks may differ); "
             "behind: collectives short of the newest a peer in the group issued; * a suspect."]
    if view.completion_word == "retired":
        notes.append("These dumps do not say when ops finished (gloo): retired ops include ops that timed out.")
    return notes


def render_rank_view(analysis: Analysis, diagnosis: Diagnosis, limit: Optional[int] = None, style=None) -> str:
    """The per-rank view as text: the verdict, then one row per class of ranks (at most
    `limit`, with a note of how many more)."""
    style = style or (lambda text, **_: text)
    view = rank_view(analysis, diagnosis.suspect_ranks)
    lines = [style(printable(diagnosis.verdict), bold=True), ""]
    lines += _rank_view_lines(view, limit)
    return "\n".join(lines).rstrip() + "\n"


def _rank_view_lines(view: RankView, limit: Optional[int]) -> list:
    shown = view.rows if limit is None else view.rows[:limit]
    table = tabulate([tuple(map(printable, rank_row_cells(row, view))) for row in shown], headers=rank_headers(view), tablefmt="simple",
                     disable_numparse=True)
    lines = [f"Where each rank is ({plural(view.rank_count, 'rank')} in {plural(len(view.rows), 'row')})"]
    lines += ["  " + line for line in table.splitlines()]
    if len(shown) < len(view.rows):
        lines.append(f"  ... {plural(len(view.rows) - len(shown), 'more row')} (frtrace --ranks shows them all)")
    lines += ["  " + note for note in rank_view_notes(view)]
    return lines


# --------------------------------------------------------------------------- text


def _finding_lines(finding: Finding, bullet: str = "  - ", verbose: bool = False) -> list[str]:
    label = finding.kind if finding.is_root else f"{finding.kind}, consequence"
    lines = [f"{bullet}[{finding.severity}: {label}] {finding.message}"]
    pad = " " * len(bullet)
    evidence = finding.evidence
    for cls in evidence.get("classes", []):
        lines.append(f"{pad}  {ranks_text(cls['ranks'])}: {cls['entry']}")
    if "suspect_call_site" in evidence:
        lines.append(f"{pad}  suspect call site: {evidence['suspect_call_site']}")
    if "peer_call_site" in evidence:
        lines.append(f"{pad}  peer call site:    {evidence['peer_call_site']}")
    for rank, past in sorted(evidence.get("went_past", {}).items(), key=lambda kv: int(kv[0])):
        if past.get("call_site"):
            lines.append(f"{pad}  rank {rank} went on at: {past['call_site']}")
    step = _next_step(finding)
    if step:
        lines.append(f"{pad}  next step: {step}")
    if verbose:
        lines.append(f"{pad}  rule: {finding.rule}")
    return lines


def _group_heading(finding: Finding) -> str:
    if finding.group_id is None:
        return "Job-wide"
    return f"Group {group_label(finding.pg_name, finding.pg_desc)}"


def render_text(analysis: Analysis, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None, style=None,
                verbose: bool = False) -> str:
    """Verdict first, then findings grouped by group, then what was read. `verbose`
    names the rule behind each finding."""
    style = style or (lambda text, **_: text)
    colour = {"healthy": "green", "faults": "red", "inconclusive": "yellow"}[diagnosis.status]
    lines = [style(printable(diagnosis.verdict), fg=colour, bold=True)]
    if diagnosis.suspect_ranks:
        lines.append(f"Suspect ranks: {fold_ranks(diagnosis.suspect_ranks)}")
    lines.append("")
    by_heading = defaultdict(list)
    for finding in diagnosis.findings:
        by_heading[_group_heading(finding)].append(finding)
    for heading, findings in by_heading.items():
        lines.append(style(printable(heading), bold=True))
        shown = findings if mismatch_cap is None else findings[:mismatch_cap]
        for finding in shown:
            lines.extend(map(printable, _finding_lines(finding, verbose=verbose)))
        if len(shown) < len(findings):
            lines.append(f"  ... {len(findings) - len(shown)} more (raise --mismatch-cap to see them)")
        lines.append("")
    lines += _rank_view_lines(rank_view(analysis, diagnosis.suspect_ranks), RANK_ROWS_IN_REPORT)
    lines.append("")
    lines.extend(map(printable, _loaded_parts(analysis)))
    return "\n".join(lines).rstrip() + "\n"


def _loaded_line(analysis: Analysis) -> str:
    return "\n".join(_loaded_parts(analysis))


def _loaded_parts(analysis: Analysis) -> list:
    """What was read, a sentence per line (unescaped: dump versions and file names)."""
    load, layout, counts = analysis.load, analysis.layout, _match_counts(analysis)
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


def _markdown_row(cells) -> str:
    return "| " + " | ".join(markdown_text(cell) if cell != "" else "-" for cell in cells) + " |"


def _markdown_table(headers, rows) -> list:
    return [_markdown_row(headers), "|" + "---|" * len(headers)] + [_markdown_row(row) for row in rows]


def finding_details(finding: Finding) -> list:
    """(label, text) pairs that say where a finding's ops were called and what to do
    next: the call sites from its evidence and its next step (unescaped)."""
    evidence, details = finding.evidence, []
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


def render_markdown(analysis: Analysis, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None) -> str:
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
    lines += _rank_view_markdown(rank_view(analysis, diagnosis.suspect_ranks), RANK_ROWS_IN_REPORT)
    lines += ["<details><summary>Inputs</summary>", "", markdown_text(_loaded_line(analysis)), "", "</details>", ""]
    return "\n".join(lines)


def _rank_view_markdown(view: RankView, limit: Optional[int]) -> list:
    shown = view.rows if limit is None else view.rows[:limit]
    lines = [f"#### Where each rank is ({plural(view.rank_count, 'rank')} in {plural(len(view.rows), 'row')})", ""]
    lines += _markdown_table(rank_headers(view), [rank_row_cells(row, view) for row in shown])
    if len(shown) < len(view.rows):
        lines += ["", f"... {plural(len(view.rows) - len(shown), 'more row')} (frtrace --ranks --format markdown shows them all)"]
    lines += [""] + [markdown_text(note) for note in rank_view_notes(view)] + [""]
    return lines


def render_rank_view_markdown(analysis: Analysis, diagnosis: Diagnosis, style=None) -> str:
    """`--ranks --format markdown`: the verdict, then every row of the per-rank view."""
    view = rank_view(analysis, diagnosis.suspect_ranks)
    return "\n".join([f"### {markdown_text(diagnosis.verdict)}", ""] + _rank_view_markdown(view, None)).rstrip() + "\n"


def render_rank_view_json(analysis: Analysis, diagnosis: Diagnosis, style=None) -> str:
    """`--ranks --format json`: the report's status, suspects, summary and `ranks` only."""
    report = {"schema": SCHEMA, "status": diagnosis.status, "suspect_ranks": list(diagnosis.suspect_ranks),
              "summary": diagnosis.verdict, "ranks": ranks_json(rank_view(analysis, diagnosis.suspect_ranks))}
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


# `--ranks`: the per-rank view alone, by --format
RANK_VIEW_RENDERERS = {"text": render_rank_view, "json": render_rank_view_json, "markdown": render_rank_view_markdown}
