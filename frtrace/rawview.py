"""The `-j/--just-print-entries` view: raw entries side by side.

Takes a `MatchResult`; returns text with one column per rank (`rank N`) and one row
per operation, aligned by group and sequence number (P2P rows by channel and order),
so the same collective sits on one line whatever each rank's buffer position.
"""

from __future__ import annotations

from typing import Iterable, Optional

from tabulate import tabulate

from .matcher import MatchResult
from .model import Entry, Group
from .wording import group_label


def _shape_text(sizes: tuple) -> str:
    return "[" + ",".join("[" + ",".join(map(str, s)) + "]" for s in sizes) + "]"


def _cell(entry: Entry, traceback_ids: Optional[dict]) -> str:
    shapes = entry.shapes
    dtypes = "/".join(sorted(set(shapes.input_dtypes) | set(shapes.output_dtypes)))
    state = "completed" if entry.completed else entry.state
    text = f"{entry.op} {_shape_text(shapes.input_sizes)}"
    if shapes.output_sizes != shapes.input_sizes:
        text += f"->{_shape_text(shapes.output_sizes)}"
    if dtypes:
        text += f" {dtypes}"
    text += f" {state}"
    if traceback_ids is not None and entry.frames:
        text += f" tb{traceback_ids.setdefault(entry.frames, len(traceback_ids))}"
    return text


def _group_label(group: Group) -> str:
    return group_label(group.name, group.desc)


def _wanted_groups(result: MatchResult, pg_filters: Iterable[str]) -> set:
    filters = [f for f in pg_filters]
    if not filters:
        return {view.group.id for view in result.views}
    return {view.group.id for view in result.views if view.group.name in filters or view.group.desc in filters}


def render_raw_entries(
    result: MatchResult,
    ranks: Optional[Iterable[int]] = None,
    pg_filters: Iterable[str] = (),
    with_stacks: bool = False,
    table_format: str = "simple",
) -> str:
    """Table of every operation (rows) by rank (columns)."""
    layout = result.layout
    columns = sorted(set(ranks) if ranks is not None else set(layout.ranks_found) | set(layout.ranks_missing))
    wanted = _wanted_groups(result, pg_filters)
    traceback_ids: Optional[dict] = {} if with_stacks else None
    rows = []
    groups = {view.group.id: view.group for view in result.views}
    for match in result.collectives:
        if match.group_id not in wanted:
            continue
        cells = []
        for rank in columns:
            entries = match.calls.get(rank)
            if entries:
                cells.append("\n".join(_cell(e, traceback_ids) for e in entries))
            elif rank in match.no_dump:
                cells.append("(no dump)")
            elif rank in match.out_of_window:
                cells.append("(before window)")
            elif rank in match.not_issued:
                cells.append("-- not issued --")
            else:
                cells.append("")
        if any(cells):
            rows.append([_group_label(groups[match.group_id]), f"#{match.seq}"] + cells)
    for p2p in result.p2p:
        if p2p.group_id not in wanted:
            continue
        by_rank = {p2p.src: p2p.send, p2p.dst: p2p.recv}
        cells = []
        for rank in columns:
            if rank in by_rank:
                entry = by_rank[rank]
                cells.append(_cell(entry, traceback_ids) if entry else "-- unmatched --")
            else:
                cells.append("")
        if any(cells):
            label = f"p2p {p2p.src if p2p.src >= 0 else '?'}->{p2p.dst} #{p2p.ordinal + 1}"
            rows.append([_group_label(groups[p2p.group_id]), label] + cells)
    headers = ["group", "seq"] + [f"rank {r}" for r in columns]
    if not rows:
        return "No entries match the selected ranks and groups."
    text = tabulate(rows, headers=headers, tablefmt=table_format)
    if traceback_ids:
        text += "\n\nStack traces (innermost first):\n" + _render_stacks(traceback_ids)
    return text


def _render_stacks(traceback_ids: dict) -> str:
    blocks = []
    for frames, tid in sorted(traceback_ids.items(), key=lambda item: item[1]):
        lines = [f"tb{tid}:"] + [f"    {f.name} at {f.filename}:{f.line}" for f in frames]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
