"""Reports from a job's logs: alone (text, JSON, markdown, HTML), or beside dumps.

Takes a `LogEvidence` and the `Diagnosis` made from it (logs alone), or an `Analysis`,
its merged `Diagnosis` and the `LogEvidence` (logs with dumps); returns strings. The
shapes are the dump reports': the verdict first, findings by group, where each rank is,
what was read; JSON of schema `frtrace.report/1` with `inputs.logs` and, per suspect,
its `host`. Pure functions; every string from a log is escaped as in the dump reports.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Iterable, NamedTuple, Optional, Sequence

from tabulate import tabulate

from frtrace.diagnosis import Diagnosis, Finding
from frtrace.diagnosis.logs import OP_NAMES
from frtrace.logs.inputs import source_of
from frtrace.logs.model import UNNAMED_GROUP, GroupPosition, LogEvidence, RankLog
from frtrace.match.analysis import Analysis
from frtrace.report.json_text import indented_json
from frtrace.report.html import render_page
from frtrace.report.render import (
    DEFAULT_WIDTH,
    SCHEMA,
    _finding_dict,
    _finding_lines,
    _group_heading,
    finding_details,
    markdown_text,
    ReportParts,
    render_markdown,
    render_text,
    report_dict,
)
from frtrace.report.text_layout import Style, wrap_line
from frtrace.util import fold_ranks, plural
from frtrace.wording import printable

ROWS_IN_REPORT = 12
RANK_HEADERS = ("ranks", "count", "state", "in", "last enqueued", "last completed", "hosts")


# --------------------------------------------------------------------------- where each rank is

class LogRow(NamedTuple):
    ranks: tuple[int, ...]
    state: str  # timed out | told to dump | ended | silent | no log | stuck watchdog
    where: str  # `all_reduce #1580 of group 0`
    last_enqueued: str
    last_completed: str
    hosts: tuple[str, ...]
    suspect: bool


def rank_rows(evidence: LogEvidence, suspects: tuple[int, ...]) -> list[LogRow]:
    """One row per class of ranks whose logs say the same, suspects first."""
    classes: dict[tuple[str, str, str, str, bool], list[int]] = defaultdict(list)
    for rank in evidence.job_ranks:
        classes[_standing(evidence.ranks.get(rank)) + (rank in suspects,)].append(rank)
    rows = []
    for key, ranks in classes.items():
        state, where, enqueued, completed, suspect = key
        hosts = tuple(sorted({h for h in (evidence.host_of(r) for r in ranks) if h}))
        rows.append(LogRow(tuple(ranks), state, where, enqueued, completed, hosts, suspect))
    return sorted(rows, key=lambda row: (not row.suspect, row.ranks[0]))


def _standing(log: Optional[RankLog]) -> tuple[str, str, str, str]:
    if log is None:
        return "no log", "", "", ""
    failed = sorted((p for p in log.groups.values() if p.failed or p.told), key=_position_order)
    if failed:
        position = failed[0]
        state = "timed out" if position.timed_out is not None else "failed" if position.failed_at is not None else "told to dump"
        return state, _where(position), _number(position.last_enqueued), _number(position.last_completed)
    if log.ending is not None:
        return f"ended: {log.ending.what}", "", "", ""
    if log.heartbeat_stuck_s is not None:
        return "watchdog stuck", "", "", ""
    if log.gloo_timeout_ms is not None:
        return "timed out (gloo)", "", "", ""
    return "logged no failure", "", "", ""


def _position_order(position: GroupPosition) -> tuple[bool, float, str]:
    return (position.first_at is None, position.first_at or 0.0, position.name)


def _where(position: GroupPosition) -> str:
    group = "" if position.name == UNNAMED_GROUP else f" of group {position.name}"
    if position.timed_out is not None:
        work = position.timed_out.work
        seq = f" #{work.seq}" if work.seq is not None else ""
        return f"{OP_NAMES.get(work.op, work.op.lower())}{seq}{group}"
    if position.failed_at is not None:
        return f"#{position.failed_at}{group}"
    return group.replace(" of ", "", 1)


def _number(value: Optional[int]) -> str:
    return "" if value is None else str(value)


def _row_cells(row: LogRow) -> tuple[str, ...]:
    hosts = ", ".join(row.hosts[:4]) + (f" (+{len(row.hosts) - 4})" if len(row.hosts) > 4 else "")
    return (fold_ranks(row.ranks) + (" *" if row.suspect else ""), str(len(row.ranks)), row.state, row.where,
            row.last_enqueued, row.last_completed, hosts)


def rows_json(rows: list[LogRow]) -> list[dict[str, object]]:
    return [{"ranks": fold_ranks(r.ranks), "count": len(r.ranks), "state": r.state, "in": r.where or None,
             "last_enqueued": int(r.last_enqueued) if r.last_enqueued else None,
             "last_completed": int(r.last_completed) if r.last_completed else None,
             "hosts": list(r.hosts), "suspect": r.suspect} for r in rows]


def _rank_lines(evidence: LogEvidence, suspects: tuple[int, ...], limit: Optional[int]) -> list[str]:
    rows = rank_rows(evidence, suspects)
    shown = rows if limit is None else rows[:limit]
    table = tabulate([tuple(map(printable, _row_cells(row))) for row in shown], headers=RANK_HEADERS, tablefmt="simple",
                     disable_numparse=True)
    lines = [f"Where each rank is, by its log ({plural(len(evidence.job_ranks), 'rank')} in {plural(len(rows), 'row')})"]
    lines += ["  " + line for line in table.splitlines()]
    if len(shown) < len(rows):
        lines.append(f"  ... {plural(len(rows) - len(shown), 'more row')} (frtrace --ranks shows them all)")
    lines.append("  last enqueued / completed: the work the rank's watchdog reported for that group; * a suspect.")
    return lines


# --------------------------------------------------------------------------- inputs

def logs_json(evidence: LogEvidence) -> dict[str, object]:
    """The report's `inputs.logs`."""
    return {
        "files": [{"path": f.path, "bytes": f.bytes_read, "lines": f.lines, "runs": f.generations,
                   "partial_last_line": f.partial_last_line, "ranks": fold_ranks(f.ranks)} for f in evidence.files],
        "ranks_found": sorted(evidence.ranks),
        "ranks_without_log": list(evidence.silent_ranks),
        "world_size": evidence.world_size,
        "world_size_from": evidence.world_size_from or None,
        "hosts": {str(r): log.host for r, log in sorted(evidence.ranks.items()) if log.host},
        "wordings": list(evidence.wordings),
        "torch_versions": evidence.torch_versions or None,
        "launcher_first_failure": evidence.launcher_first_failure,
        "notes": list(evidence.notes),
    }


def suspects_json(diagnosis: Diagnosis, evidence: LogEvidence,
                  dump_hosts: Optional[dict[int, str]] = None) -> list[dict[str, object]]:
    """`suspects`: each suspect rank with its host (null when no input says)."""
    hosts = dict(dump_hosts or {})
    return [{"rank": r, "host": evidence.host_of(r) or hosts.get(r)} for r in diagnosis.suspect_ranks]


def logs_line(evidence: LogEvidence) -> str:
    files = evidence.files
    size = sum(f.bytes_read for f in files)
    lines = sum(f.lines for f in files)
    world = evidence.world_size or len(evidence.job_ranks)
    hosts = sorted({log.host for log in evidence.ranks.values() if log.host})
    parts = [f"Read {plural(len(files), 'log')} ({_size(size)}, {plural(lines, 'line')}) of a {world}-rank job"
             + (f" (watchdog wording of torch {evidence.torch_versions})" if evidence.torch_versions else "")
             + f": lines of {plural(len(evidence.ranks), 'rank')}"
             + (f" on {plural(len(hosts), 'host')}" if hosts else "") + "."]
    if evidence.silent_ranks:
        parts.append(f"No log line of ranks {fold_ranks(evidence.silent_ranks)}.")
    parts += evidence.notes[:5]
    return "\n".join(parts)


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


# --------------------------------------------------------------------------- logs alone

def render_logs_text(evidence: LogEvidence, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None,
                     style: Optional[Style] = None,
                     verbose: bool = False) -> str:
    style = style or (lambda text, **_: text)
    colour = {"healthy": "green", "faults": "red", "inconclusive": "yellow"}[diagnosis.status]
    lines = [style(printable(diagnosis.verdict), fg=colour, bold=True)]
    if diagnosis.suspect_ranks:
        lines.append(f"Suspect ranks: {fold_ranks(diagnosis.suspect_ranks)}" + _hosts_suffix(diagnosis, evidence))
    lines.append("")
    by_heading: dict[str, list[Finding]] = defaultdict(list)
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
    lines += _rank_lines(evidence, diagnosis.suspect_ranks, ROWS_IN_REPORT)
    lines += ["", printable(logs_line(evidence))]
    return "\n".join(lines).rstrip() + "\n"


def _hosts_suffix(diagnosis: Diagnosis, evidence: LogEvidence) -> str:
    hosts = [(r, evidence.host_of(r)) for r in diagnosis.suspect_ranks if evidence.host_of(r)]
    if not hosts:
        return ""
    return " (" + ", ".join(f"{r} on {h}" for r, h in hosts[:8]) + (", ..." if len(hosts) > 8 else "") + ")"


def logs_report_dict(evidence: LogEvidence, diagnosis: Diagnosis) -> dict[str, object]:
    found = sorted(evidence.ranks)
    return {
        "schema": SCHEMA,
        "status": diagnosis.status,
        "suspect_ranks": list(diagnosis.suspect_ranks),
        "suspects": suspects_json(diagnosis, evidence),
        "summary": diagnosis.verdict,
        "inputs": {"ranks_found": [], "ranks_missing": [], "world_size": evidence.world_size or len(evidence.job_ranks),
                   "logs": logs_json(evidence), "ranks_in_logs": found},
        "matched": None,
        "findings": [_finding_dict(f) for f in diagnosis.findings],
        "ranks": rows_json(rank_rows(evidence, diagnosis.suspect_ranks)),
    }


def render_logs_json(evidence: LogEvidence, diagnosis: Diagnosis) -> str:
    return indented_json(logs_report_dict(evidence, diagnosis)) + "\n"


def render_logs_markdown(evidence: LogEvidence, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None) -> str:
    lines = [f"### {markdown_text(diagnosis.verdict)}", ""]
    if diagnosis.suspect_ranks:
        lines += [f"Suspect ranks: **{fold_ranks(diagnosis.suspect_ranks)}**{markdown_text(_hosts_suffix(diagnosis, evidence))}", ""]
    if diagnosis.findings:
        rows = []
        per_group: dict[Optional[int], int] = defaultdict(int)
        for finding in diagnosis.findings:
            per_group[finding.group_id] += 1
            if mismatch_cap is not None and per_group[finding.group_id] > mismatch_cap:
                continue
            seq = "" if finding.collective_seq_id is None else str(finding.collective_seq_id)
            rows.append((finding.severity, finding.kind + ("" if finding.is_root else " (consequence)"), finding.pg_name,
                         finding.op or "", seq, fold_ranks(finding.suspect_ranks), finding.message))
        lines += _markdown_table(("severity", "kind", "group", "op", "seq", "suspects", "what"), rows) + [""]
        for finding in diagnosis.findings:
            details = finding_details(finding)
            if finding.is_root and details:
                lines.append(f"- **{markdown_text(finding.kind)}**: {markdown_text(finding.message)}")
                lines += [f"  - {label}: {markdown_text(text)}" for label, text in details]
        lines.append("")
    rows_ = rank_rows(evidence, diagnosis.suspect_ranks)
    lines += [f"#### Where each rank is, by its log ({plural(len(rows_), 'row')})", ""]
    lines += _markdown_table(RANK_HEADERS, [_row_cells(r) for r in rows_[:ROWS_IN_REPORT]])
    lines += ["", "<details><summary>Inputs</summary>", "", markdown_text(logs_line(evidence)), "", "</details>", ""]
    return "\n".join(lines)


def _markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(markdown_text(c) if c != "" else "-" for c in cells) + " |"
    return [row(headers), "|" + "---|" * len(headers)] + [row(r) for r in rows]


def render_logs_ranks(evidence: LogEvidence, diagnosis: Diagnosis, fmt: str, style: Optional[Style] = None) -> str:
    """`--ranks`: the verdict and every row of where each rank is."""
    if fmt == "json":
        report = {"schema": SCHEMA, "status": diagnosis.status, "suspect_ranks": list(diagnosis.suspect_ranks),
                  "summary": diagnosis.verdict, "ranks": rows_json(rank_rows(evidence, diagnosis.suspect_ranks))}
        return indented_json(report) + "\n"
    if fmt == "markdown":
        rows = rank_rows(evidence, diagnosis.suspect_ranks)
        return "\n".join([f"### {markdown_text(diagnosis.verdict)}", ""]
                         + _markdown_table(RANK_HEADERS, [_row_cells(r) for r in rows])) + "\n"
    style = style or (lambda text, **_: text)
    lines = [style(printable(diagnosis.verdict), bold=True), ""] + _rank_lines(evidence, diagnosis.suspect_ranks, None)
    return "\n".join(lines).rstrip() + "\n"


def render_logs_html(evidence: LogEvidence, diagnosis: Diagnosis) -> str:
    """The logs' report as the dump report's page draws it (report/html.render_page):
    verdict, findings, where each rank is by its log; no rank x group grid."""
    rows = rank_rows(evidence, diagnosis.suspect_ranks)
    consequences = sum(1 for finding in diagnosis.findings if not finding.is_root)
    folded = [f"Consequences of the root cause: {plural(consequences, 'finding')}"]
    ranks = {"summary": "Where each rank is, by its log", "headers": list(RANK_HEADERS),
             "rows": [{"suspect": row.suspect, "cells": list(_row_cells(row))} for row in rows], "notes": []}
    return render_page(diagnosis, folded, None, ranks, [logs_line(evidence)])


# --------------------------------------------------------------------------- logs with dumps

def render_with_logs(fmt: str, analysis: Analysis, diagnosis: Diagnosis, evidence: LogEvidence,
                     mismatch_cap: Optional[int] = None, style: Optional[Style] = None, verbose: bool = False,
                     width: Optional[int] = DEFAULT_WIDTH, show_all: bool = False,
                     parts: Optional[ReportParts] = None) -> str:
    """The dump report, with the logs' findings in it and what the logs were (`width`,
    `show_all` and `parts` as for `render_text`)."""
    if fmt == "json":
        report = report_dict(analysis, diagnosis, parts)
        report["inputs"]["logs"] = logs_json(evidence)
        report["suspects"] = suspects_json(diagnosis, evidence, dump_hosts(analysis))
        return indented_json(report) + "\n"
    if fmt == "markdown":
        text = render_markdown(analysis, diagnosis, mismatch_cap, parts)
        return text + "\n" + markdown_text(logs_line(evidence)) + "\n\n"
    text = render_text(analysis, diagnosis, mismatch_cap, style, verbose, width, show_all, parts)
    return text + "\n".join(wrap_line(printable(logs_line(evidence)), width)) + "\n"


def dump_hosts(analysis: Analysis) -> dict[int, str]:
    """Hosts that dump file names give (`nccl_trace_rank_node02_5`, `host0.pci3_rank_5`),
    read as log names are."""
    hosts = {}
    for dump in analysis.dumps:
        path = Path(str(dump.path))
        host = source_of(path, path.parent).host
        if host:
            hosts[dump.rank] = host
    return hosts

