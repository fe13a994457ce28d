"""`frtrace diff` reports: text, markdown and JSON (schema `frtrace.diff/1`) of a
`progress_diff.ProgressDiff`. Pure functions; sorted and deterministic."""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from tabulate import tabulate

from frtrace.match.analysis import LoadedJob
from frtrace.model import Entry
from frtrace.report.json_text import indented_json
from frtrace.report.progress_diff import (
    IDLE,
    MOVED,
    STUCK,
    UNKNOWN,
    GroupProgress,
    Position,
    ProgressDiff,
    name_key,
    waiting_text,
)
from frtrace.report.text_layout import Style
from frtrace.util import fold_ranks, plural
from frtrace.wording import group_label, printable, ranks_text

SCHEMA = "frtrace.diff/1"
STATUS_WORD = {"healthy": "PROGRESSING", "faults": "STUCK", "inconclusive": "INCONCLUSIVE"}
# How many folded group names a table cell lists before "... (N groups)".
NAMES_SHOWN = 6


# --------------------------------------------------------------------------- JSON


def diff_dict(diff: ProgressDiff) -> dict[str, object]:
    return {
        "schema": SCHEMA,
        "status": diff.status,
        "summary": diff.verdict,
        "moved_ranks": diff.ranks_with(MOVED),
        "stuck_ranks": diff.ranks_with(STUCK),
        "idle_ranks": diff.ranks_with(IDLE),
        "unknown_ranks": diff.ranks_with(UNKNOWN),
        "no_progress_ranks": sorted(diff.ranks_with(STUCK) + diff.ranks_with(IDLE)),
        "inputs": {"old": _inputs(diff.old), "new": _inputs(diff.new)},
        "ranks": [
            {"rank": r.rank, "progress": r.progress, "reason": r.reason,
             "newest_record_id": {"old": r.old_record_id, "new": r.new_record_id},
             "stuck_in": None if r.stuck_in is None else {
                 "pg_name": r.stuck_in[0].name, "pg_desc": r.stuck_in[0].desc, **_entry_dict(r.stuck_in[1])}}
            for r in diff.ranks
        ],
        "groups": [_group_dict(g) for g in diff.groups],
    }


def _inputs(analysis: LoadedJob) -> dict[str, object]:
    layout = analysis.layout
    return {
        "world_size": layout.world_size,
        "ranks_found": list(layout.ranks_found),
        "ranks_missing": list(layout.ranks_missing),
        "entries": sum(len(d.entries) for d in analysis.dumps),
        "unreadable_files": sorted(str(e) for e in list(analysis.load.errors) + list(layout.ignored_files)),
    }


def _entry_dict(entry: Optional[Entry]) -> dict[str, object]:
    if entry is None:
        return {"op": None, "collective_seq_id": None, "p2p_seq_id": None, "record_id": None, "state": None}
    return {"op": entry.op, "collective_seq_id": None if entry.is_p2p else entry.collective_seq_id,
            "p2p_seq_id": entry.p2p_seq_id if entry.is_p2p else None, "record_id": entry.record_id, "state": entry.state}


def _position_dict(position: Optional[Position]) -> Optional[dict[str, object]]:
    if position is None:
        return None
    status = position.status
    return {
        "newest_record_id": position.newest_record_id,
        "collective_seq_id": position.collective_seq_id,
        "p2p_seq_id": position.p2p_seq_id,
        "newest_finished_record_id": position.done_record_id,
        "waiting_in": None if position.waiting is None else _entry_dict(position.waiting),
        "pg_status": None if status is None else {"last_enqueued": status.last_enqueued,
                                                  "last_started": status.last_started,
                                                  "last_completed": status.last_completed},
    }


def _group_dict(group: GroupProgress) -> dict[str, object]:
    return {
        "pg_name": group.name,
        "pg_desc": group.desc,
        "ranks": list(group.ranks),
        "status": group.status,
        "moved_ranks": group.ranks_with(MOVED),
        "stuck_ranks": group.ranks_with(STUCK),
        "idle_ranks": group.ranks_with(IDLE),
        "unknown_ranks": group.ranks_with(UNKNOWN),
        "members": [{"rank": m.rank, "progress": m.progress, "reason": m.reason,
                     "old": _position_dict(m.old), "new": _position_dict(m.new)} for m in group.members],
    }


def render_diff_json(diff: ProgressDiff) -> str:
    return indented_json(diff_dict(diff)) + "\n"


# --------------------------------------------------------------------------- tables

HEADERS = ["group", "members", "status", "moved", "no progress (waiting in)", "idle", "unknown"]


def _waiting_cell(groups: list[GroupProgress]) -> str:
    waits: defaultdict[str, list[int]] = defaultdict(list)
    for group in groups:
        for member in group.members:
            if member.progress == STUCK:
                waits[waiting_text(member.waiting)].append(member.rank)
    if not waits:
        return "-"
    parts = sorted(waits.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    return "; ".join(f"{fold_ranks(ranks)} ({what})" for what, ranks in parts)


def _names_cell(groups: list[GroupProgress]) -> str:
    names = [g.name for g in groups]
    if len(names) > 1 and all(n.isdigit() for n in names):
        text = fold_ranks(int(n) for n in names)
    else:
        text = ",".join(names[:NAMES_SHOWN]) + (",..." if len(names) > NAMES_SHOWN else "")
    label = group_label(text, groups[0].desc)
    return label if len(groups) == 1 else f"{label} ×{len(groups)}"


def table_rows(diff: ProgressDiff) -> list[list[str]]:
    """One row per set of groups alike (same description, status and ops waited in),
    rank lists folded: thousands of healthy TP groups take one line."""
    buckets: dict[tuple[str, str, tuple[str, ...]], list[GroupProgress]] = {}  # (desc, status, ops waited in) -> groups
    for group in diff.groups:
        waits = tuple(sorted({waiting_text(m.waiting) for m in group.members if m.progress == STUCK}))
        buckets.setdefault((group.desc, group.status, waits), []).append(group)
    rows: list[list[str]] = []
    order = {STUCK: 0, UNKNOWN: 1, IDLE: 2, MOVED: 3}
    for (desc, status, _), groups in sorted(buckets.items(), key=lambda kv: (order[kv[0][1]], name_key(kv[1][0].name), kv[0][0])):
        def union(progress: str) -> str:
            return fold_ranks(r for g in groups for r in g.ranks_with(progress)) or "-"

        rows.append([_names_cell(groups), fold_ranks(r for g in groups for r in g.ranks), status,
                     union(MOVED), _waiting_cell(groups), union(IDLE), union(UNKNOWN)])
    return rows


def _inputs_line(diff: ProgressDiff, old_name: str, new_name: str) -> str:
    def side(label: str, name: str, analysis: LoadedJob) -> str:
        missing = analysis.layout.ranks_missing
        text = f"{label} {name}: {plural(len(analysis.layout.ranks_found), 'dump')}"
        return text + (f" (no dump from {ranks_text(missing)})" if missing else "")

    return f"{side('OLD', old_name, diff.old)}; {side('NEW', new_name, diff.new)}"


def _printable_rows(diff: ProgressDiff) -> list[list[str]]:
    return [[printable(cell) for cell in row] for row in table_rows(diff)]


def render_diff_text(diff: ProgressDiff, old_name: str = "OLD", new_name: str = "NEW",
                     style: Optional[Style] = None) -> str:
    # Group names, descriptions, ops and paths come from the dumps and the command line:
    # each is shown escaped (wording.printable), as in every other report.
    verdict = printable(diff.verdict)
    if style is not None:
        word, _, rest = verdict.partition(":")
        colour = {"healthy": "green", "faults": "red"}.get(diff.status, "yellow")
        verdict = style(word, fg=colour, bold=True) + ":" + rest
    lines = [verdict, printable(_inputs_line(diff, old_name, new_name)), ""]
    rows = _printable_rows(diff)
    lines.append(tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True) if rows
                 else "(no process group in either dump set)")
    if diff.status == "faults":
        lines += ["", f"next step: frtrace {printable(new_name)}   (who the stuck ranks wait for, and where it was called)"]
    return "\n".join(lines) + "\n"


def render_diff_markdown(diff: ProgressDiff, old_name: str = "OLD", new_name: str = "NEW") -> str:
    rows = [[cell.replace("|", "\\|") for cell in row] for row in _printable_rows(diff)]
    lines = [f"### frtrace diff: {STATUS_WORD[diff.status]}", "", f"**{printable(diff.verdict)}**", "",
             printable(_inputs_line(diff, f"`{old_name}`", f"`{new_name}`")), "",
             tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True), ""]
    return "\n".join(lines)

