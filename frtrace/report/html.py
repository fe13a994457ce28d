"""A self-contained HTML report (`--html report.html`): the verdict, the findings with
their call sites and next steps, a rank x group grid coloured by where each class of
ranks stands, and the per-rank table.

Takes the `Analysis` and its `Diagnosis`; returns one HTML string (inline CSS, no
script, no external request: a Content-Security-Policy forbids any). Every string
that comes from the dumps is HTML-escaped. Pure: the same dumps give the same bytes.
"""

from __future__ import annotations

from html import escape
from typing import Optional

from frtrace._version import __version__
from frtrace.diagnosis import Diagnosis
from frtrace.match.analysis import Analysis
from frtrace.report.rank_view import NO_DUMP, GroupCell, RankView, StandingRow, rank_view
from frtrace.report.render import (
    _loaded_parts,
    finding_details,
    rank_headers,
    rank_row_cells,
    rank_view_notes,
)
from frtrace.util import fold_ranks, plural
from frtrace.wording import group_label, groups_text, printable, seq_label

# Beyond this many classes of groups the grid shows the first ones and says so.
GRID_COLUMNS = 24

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1d1d1f;background:#fff}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{padding:14px 18px;border-radius:6px;border-left:8px solid}
.faults{background:#fdecea;border-color:#d93025}.inconclusive{background:#fff6e0;border-color:#e8a400}
.healthy{background:#e8f5e9;border-color:#2e7d32}
.finding{border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:10px 0}
.finding.consequence{opacity:.8;background:#fafafa}
.tag{font-size:12px;font-weight:600;text-transform:uppercase;color:#555}
.tag.error{color:#d93025}.tag.warning{color:#b26a00}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:8px 0 0}dt{color:#555}dd{margin:0}
code{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;background:#f3f3f3;padding:1px 4px;border-radius:3px;word-break:break-all}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
thead th{background:#f3f3f3;position:sticky;top:0}
.grid td{min-width:96px}.grid small,.sub{color:#555;font-size:11px;display:block;font-weight:normal}
.c-blocked{background:#e45756;color:#fff}.c-blocked small{color:#fde}
.c-behind{background:#f2a541}.c-ok{background:#c8e6c9}.c-none{background:#fafafa;color:#aaa}
.c-nodump{background:#555;color:#fff}.suspect th{box-shadow:inset 4px 0 #d93025}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border-radius:3px;font-size:12px}
.note{color:#555;font-size:12px}footer{margin-top:28px;color:#777;font-size:12px}
"""


def _e(text: object) -> str:
    # printable first: a control or bidi character from a dump is shown as its escape,
    # never left to reorder or hide what the page says.
    return escape(printable(str(text)), quote=True)


def render_html(analysis: Analysis, diagnosis: Diagnosis) -> str:
    view = rank_view(analysis, diagnosis.suspect_ranks)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # Nothing may load from anywhere: no script, image, font or style from outside.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>frtrace: {_e(diagnosis.verdict)}</title>",
        f"<style>{CSS}</style></head><body>",
        f'<header class="verdict {_e(diagnosis.status)}"><h1 id="verdict">{_e(diagnosis.verdict)}</h1>',
    ]
    if diagnosis.suspect_ranks:
        parts.append(f'<div>Suspect ranks: <strong id="suspects">{_e(fold_ranks(diagnosis.suspect_ranks))}</strong></div>')
    parts.append("</header>")
    parts += _findings(diagnosis)
    parts += _grid(view)
    parts += _rank_table(view)
    inputs = "\n".join(map(_e, _loaded_parts(analysis)))
    parts.append(f"<footer>{inputs}<br>frtrace {_e(__version__)}</footer>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(path: str, analysis: Analysis, diagnosis: Diagnosis) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_html(analysis, diagnosis))


def _findings(diagnosis: Diagnosis) -> list:
    """Root findings in full; their consequences folded away under one summary (no script needed)."""
    parts = ["<section><h2>Findings</h2>"]
    if not diagnosis.findings:
        parts.append('<p class="note">No findings.</p>')
    roots = [f for f in diagnosis.findings if f.is_root]
    consequences = [f for f in diagnosis.findings if not f.is_root]
    for finding in roots:
        parts += _finding(finding)
    if consequences:
        parts.append(f"<details><summary>{plural(len(consequences), 'consequence')} of the root cause"
                     f"{'s' if len(roots) > 1 else ''} (other groups held up)</summary>")
        for finding in consequences:
            parts += _finding(finding)
        parts.append("</details>")
    parts.append("</section>")
    return parts


def _finding(finding) -> list:
    role = "root" if finding.is_root else "consequence"
    group = f" · group {_e(group_label(finding.pg_name, finding.pg_desc))}" if finding.group_id is not None else ""
    parts = [f'<article class="finding {role}"><div class="tag {_e(finding.severity)}">'
             f'{_e(finding.severity)} · {_e(finding.kind)}{"" if finding.is_root else " (consequence)"}{group}</div>',
             f"<p>{_e(finding.message)}</p>"]
    details = finding_details(finding)
    if details:
        parts.append("<dl>" + "".join(
            f"<dt>{_e(label)}</dt><dd>{_e(text) if label == 'next step' else f'<code>{_e(text)}</code>'}</dd>"
            for label, text in details) + "</dl>")
    parts.append("</article>")
    return parts


def _seq_span(newest: Optional[tuple]) -> str:
    if newest is None:
        return "?"
    low, high = newest
    return f"#{low}" if low == high else f"#{low}-{high}"


def _cell(cell: Optional[GroupCell], row: StandingRow) -> str:
    if cell is None:
        return '<td class="c-none" title="not a member">·</td>'
    where = groups_text(cell.pg_names, cell.group_class.desc)
    if cell.blocked_here:
        op = row.blocked_in
        assert op is not None  # a rank blocked here is blocked in an op
        seq = seq_label(op.collective_seq_id, op.p2p_seq_id)
        extra = f" · {cell.behind} behind" if cell.behind else ""
        return (f'<td class="c-blocked" title="{_e(where)}"><b>blocked</b> {_e(op.op)} {_e(seq)}'
                f'<small>{_e(op.state)}{_e(extra)}</small></td>')
    if cell.behind:
        return (f'<td class="c-behind" title="{_e(where)}"><b>{cell.behind} behind</b>'
                f'<small>at {_e(_seq_span(cell.newest))}</small></td>')
    return f'<td class="c-ok" title="{_e(where)}">at {_e(_seq_span(cell.newest))}</td>'


def _grid(view: RankView) -> list:
    classes = view.classes[:GRID_COLUMNS]
    parts = ["<section><h2>Ranks × groups</h2>",
             '<p class="legend"><span class="c-blocked">blocked in an op of that group</span>'
             '<span class="c-behind">behind its peers there</span><span class="c-ok">up to date there (newest seq)</span>'
             '<span class="c-nodump">no dump</span><span class="c-none">not a member</span></p>',
             '<table class="grid"><thead><tr><th>ranks</th><th>count</th>']
    for group_class, names in zip(classes, view.class_names):
        label = group_class.desc or group_label(names[0], "")
        sub = groups_text(names, "") if names else ""
        parts.append(f"<th>{_e(label)}<small>{_e(sub)}</small></th>")
    parts.append("</tr></thead><tbody>")
    for row in view.rows:
        cells = {cell.group_class.key: cell for cell in row.cells}
        parts.append(f'<tr class="{"suspect" if row.suspect else ""}"><th>{_e(fold_ranks(row.ranks))}'
                     f'{" <small>suspect</small>" if row.suspect else ""}</th><td>{len(row.ranks)}</td>')
        if row.standing == NO_DUMP:
            parts.append(f'<td class="c-nodump" colspan="{len(classes)}">no dump</td>')
        else:
            parts += [_cell(cells.get(c.key), row) for c in classes]
        parts.append("</tr>")
    parts.append("</tbody></table>")
    if len(view.classes) > len(classes):
        parts.append(f'<p class="note">{plural(len(view.classes) - len(classes), "more class")} of groups not shown.</p>')
    parts.append('<p class="note">Groups with the same description and size (the TP groups, the DP groups ...) '
                 "share a column; hover a cell for the groups of its ranks.</p></section>")
    return parts


def _rank_table(view: RankView) -> list:
    parts = [f"<section><h2>Where each rank is</h2><p class=\"note\">{plural(view.rank_count, 'rank')} "
             f"in {plural(len(view.rows), 'row')}</p><table><thead><tr>"]
    parts += [f"<th>{_e(h)}</th>" for h in rank_headers(view)]
    parts.append("</tr></thead><tbody>")
    for row in view.rows:
        parts.append(f'<tr class="{"suspect" if row.suspect else ""}">'
                     + "".join(f"<td>{_e(cell)}</td>" for cell in rank_row_cells(row, view)) + "</tr>")
    parts.append("</tbody></table>")
    parts += [f'<p class="note">{_e(note)}</p>' for note in rank_view_notes(view)]
    parts.append("</section>")
    return parts
