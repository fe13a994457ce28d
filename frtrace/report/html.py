"""A self-contained HTML report (`--html report.html`): the verdict, the findings with
their call sites and next steps, a rank x group grid coloured by where each class of
ranks stands, and the per-rank table.

Takes the `Analysis` and its `Diagnosis`; returns one HTML string (inline CSS, no
script, no external request: a Content-Security-Policy forbids any), rendered from
`templates/report.html` with autoescaping: every value is HTML-escaped, after control
and bidi characters are written as visible escapes (`wording.printable`), so a dump's
strings can neither inject markup nor reorder the page. The layout holds from phone
width up: long strings wrap, wide tables scroll inside their own box. Pure: the same
dumps give the same bytes.
"""

from __future__ import annotations

from typing import Any, Optional

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from frtrace._version import __version__
from frtrace.diagnosis import Diagnosis, Finding
from frtrace.match.analysis import Analysis
from frtrace.report.rank_view import NO_DUMP, GroupCell, GroupClass, RankView, StandingRow
from frtrace.report.render import (
    ReportParts,
    _loaded_parts,
    consequence_lines,
    finding_details,
    rank_headers,
    rank_row_cells,
    rank_view_notes,
)
from frtrace.util import fold_ranks, plural
from frtrace.wording import group_label, groups_text, printable, seq_label

# Beyond this many classes of groups the grid shows the first ones (those where a rank is
# blocked or a root finding is always among them) and says so.
GRID_COLUMNS = 24

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1d1d1f;background:#fff;overflow-wrap:anywhere}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{padding:14px 18px;border-radius:6px;border-left:8px solid}
.faults{background:#fdecea;border-color:#d93025}.inconclusive{background:#fff6e0;border-color:#e8a400}
.healthy{background:#e8f5e9;border-color:#2e7d32}
.finding{border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:10px 0}
.finding.consequence{opacity:.8;background:#fafafa}
.tag{font-size:12px;font-weight:600;text-transform:uppercase;color:#555}
.tag.error{color:#d93025}.tag.warning{color:#b26a00}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 12px;margin:8px 0 0}dt{color:#555}dd{margin:0;min-width:0}
code{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;background:#f3f3f3;padding:1px 4px;border-radius:3px;white-space:pre-wrap;word-break:break-all}
ul.folded{margin:8px 0;padding-left:20px}
.scroll{overflow:auto;max-width:100%;max-height:80vh;border:1px solid #ddd;border-radius:4px}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
.scroll table{border-style:hidden}
thead th{background:#f3f3f3;position:sticky;top:0;z-index:1}
.grid th,.grid td{min-width:96px;max-width:18em}.ranks td{min-width:7em;max-width:28em}
.grid small,.sub{color:#555;font-size:11px;display:block;font-weight:normal}
.c-blocked{background:#e45756;color:#fff}.c-blocked small{color:#fde}
.c-behind{background:#f2a541}.c-ok{background:#c8e6c9}.c-none{background:#fafafa;color:#aaa}
.c-nodump{background:#555;color:#fff}.suspect th{box-shadow:inset 4px 0 #d93025}
.legend span{display:inline-block;padding:2px 8px;margin:0 6px 4px 0;border-radius:3px;font-size:12px}
.note{color:#555;font-size:12px}footer{margin-top:28px;color:#777;font-size:12px}
@media (max-width:600px){body{margin:10px;font-size:13px}h1{font-size:17px}.verdict{padding:10px 12px;border-left-width:5px}
dl{grid-template-columns:minmax(0,1fr)}dd{margin-bottom:6px}.finding{padding:8px 10px}}
"""


def _visible(value: Any) -> Any:
    """Every value the template prints, before autoescaping: control and bidi characters
    become visible escapes (our own markup, the stylesheet, passes as it is)."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return printable(value)


_ENVIRONMENT = Environment(loader=PackageLoader("frtrace.report", "templates"), autoescape=True, finalize=_visible,
                           undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render_html(analysis: Analysis, diagnosis: Diagnosis, parts: Optional[ReportParts] = None) -> str:
    parts = ReportParts.of(analysis, parts)
    view = parts.view(diagnosis.suspect_ranks)
    roots = [f for f in diagnosis.findings if f.is_root]
    consequences = [f for f in diagnosis.findings if not f.is_root]
    folded = consequence_lines(analysis, consequences, len(roots), listed_by=None) if consequences else [""]
    return render_page(diagnosis, folded, _grid(view, roots), _rank_table(view),
                       list(_loaded_parts(analysis, parts.matched)))


def render_page(diagnosis: Diagnosis, folded: list[str], grid: Optional[dict[str, Any]], ranks: dict[str, Any],
                loaded: list[str]) -> str:
    """The page around a diagnosis: its verdict and findings (consequences under `folded`:
    a heading, then one line per class of groups), the rank x group `grid` (None: none),
    the `ranks` table (summary, headers, rows of {suspect, cells}, notes) and the `loaded`
    lines of the footer. The logs' report (report/logs_report.py) draws its page here too."""
    roots = [f for f in diagnosis.findings if f.is_root]
    consequences = [f for f in diagnosis.findings if not f.is_root]
    return _ENVIRONMENT.get_template("report.html").render(
        css=Markup(CSS), verdict=diagnosis.verdict, status=diagnosis.status,
        suspects=fold_ranks(diagnosis.suspect_ranks) if diagnosis.suspect_ranks else "",
        roots=[_finding(f) for f in roots], consequences=[_finding(f) for f in consequences],
        consequence_heading=folded[0], consequence_classes=[line.strip().removeprefix("- ") for line in folded[1:]],
        grid=grid, ranks=ranks, loaded=loaded, version=__version__,
    )


def write_html(path: str, analysis: Analysis, diagnosis: Diagnosis, parts: Optional[ReportParts] = None) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_html(analysis, diagnosis, parts))


def _finding(finding: Finding) -> dict[str, object]:
    group = f" · group {group_label(finding.pg_name, finding.pg_desc)}" if finding.group_id is not None else ""
    return {
        "role": "root" if finding.is_root else "consequence",
        "severity": finding.severity,
        "tag": f"{finding.severity} · {finding.kind}{'' if finding.is_root else ' (consequence)'}{group}",
        "message": finding.message,
        "details": [(label, text, label != "next step") for label, text in finding_details(finding)],
    }


def _seq_span(newest: Optional[tuple[int, int]]) -> str:
    if newest is None:
        return "?"
    low, high = newest
    return f"#{low}" if low == high else f"#{low}-{high}"


def _cell(cell: Optional[GroupCell], row: StandingRow) -> dict[str, str]:
    if cell is None:
        return {"css": "c-none", "title": "not a member", "head": "", "text": "·", "sub": ""}
    where = groups_text(cell.pg_names, cell.group_class.desc)
    if cell.blocked_here:
        op = row.blocked_in
        assert op is not None  # a rank blocked here is blocked in an op
        extra = f" · {cell.behind} behind" if cell.behind else ""
        return {"css": "c-blocked", "title": where, "head": "blocked",
                "text": f"{op.op} {seq_label(op.collective_seq_id, op.p2p_seq_id)}", "sub": f"{op.state}{extra}"}
    if cell.behind:
        return {"css": "c-behind", "title": where, "head": f"{cell.behind} behind", "text": "",
                "sub": f"at {_seq_span(cell.newest)}"}
    return {"css": "c-ok", "title": where, "head": "", "text": f"at {_seq_span(cell.newest)}", "sub": ""}


def _grid_classes(view: RankView, roots: list[Finding]) -> list[GroupClass]:
    """The classes of groups the grid shows: every one where a row is blocked or a root
    finding is, then the others in order, up to GRID_COLUMNS; in the view's order."""
    if len(view.classes) <= GRID_COLUMNS:
        return list(view.classes)
    root_groups = {f.pg_name for f in roots}
    wanted = {row.blocked_in.group_class.key for row in view.rows if row.blocked_in is not None}
    wanted |= {c.key for c, names in zip(view.classes, view.class_names) if root_groups & set(names)}
    keys = [c.key for c in view.classes if c.key in wanted][:GRID_COLUMNS]
    keys += [c.key for c in view.classes if c.key not in wanted][:GRID_COLUMNS - len(keys)]
    return [c for c in view.classes if c.key in set(keys)]


def _grid(view: RankView, roots: list[Finding]) -> dict[str, object]:
    classes = _grid_classes(view, roots)
    names_of = dict(zip((c.key for c in view.classes), view.class_names))
    columns = [{"label": c.desc or group_label(names_of[c.key][0], ""), "sub": groups_text(names_of[c.key], "") if names_of[c.key] else ""}
               for c in classes]
    rows = []
    for row in view.rows:
        cells = {cell.group_class.key: cell for cell in row.cells}
        rows.append({"ranks": fold_ranks(row.ranks), "suspect": row.suspect, "count": len(row.ranks),
                     "no_dump": row.standing == NO_DUMP, "cells": [_cell(cells.get(c.key), row) for c in classes]})
    hidden = len(view.classes) - len(classes)
    return {"columns": columns, "rows": rows,
            "hidden": f"{plural(hidden, 'more class')} of groups not shown." if hidden else ""}


def _rank_table(view: RankView) -> dict[str, object]:
    return {"summary": f"{plural(view.rank_count, 'rank')} in {plural(len(view.rows), 'row')}",
            "headers": rank_headers(view),
            "rows": [{"suspect": row.suspect, "cells": rank_row_cells(row, view)} for row in view.rows],
            "notes": rank_view_notes(view)}
