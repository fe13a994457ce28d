"""Render a `Diagnosis` as text, JSON (schema `frtrace.report/1`) or markdown.

Takes the `Analysis` and its `Diagnosis`; returns a string. Pure functions: the same
inputs give byte-identical output (ranks and groups sorted, no timestamps of ours).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Optional

from .diagnosis import Diagnosis, Finding, kind
from .pipeline import Analysis
from .util import fold_ranks, plural
from .wording import group_label, ranks_text

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
        "ranks_wrapped": [d.rank for d in dumps if d.wrapped],
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
    return template.format(suspects=fold_ranks(finding.suspect_ranks or finding.ranks))


def report_dict(analysis: Analysis, diagnosis: Diagnosis) -> dict:
    return {
        "schema": SCHEMA,
        "status": diagnosis.status,
        "suspect_ranks": list(diagnosis.suspect_ranks),
        "summary": diagnosis.verdict,
        "inputs": _inputs(analysis),
        "matched": _match_counts(analysis),
        "findings": [_finding_dict(f) for f in diagnosis.findings],
    }


def _match_counts(analysis: Analysis) -> dict:
    states = Counter()
    for match in analysis.matches.collectives:
        if match.disagreement is not None:
            states["mismatched"] += 1
        elif match.not_issued or match.no_dump:
            states["partial"] += 1
        else:
            states["agreed"] += 1
    p2p_paired = sum(1 for p in analysis.matches.p2p if p.send is not None and p.recv is not None)
    return {
        "collectives": len(analysis.matches.collectives),
        "collectives_agreed": states["agreed"],
        "collectives_partial": states["partial"],
        "collectives_mismatched": states["mismatched"],
        "p2p_pairs": p2p_paired,
        "p2p_unpaired": len(analysis.matches.p2p) - p2p_paired,
    }


def render_json(analysis: Analysis, diagnosis: Diagnosis) -> str:
    return json.dumps(report_dict(analysis, diagnosis), indent=2, sort_keys=True) + "\n"


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
    lines = [style(diagnosis.verdict, fg=colour, bold=True)]
    if diagnosis.suspect_ranks:
        lines.append(f"Suspect ranks: {fold_ranks(diagnosis.suspect_ranks)}")
    lines.append("")
    by_heading = defaultdict(list)
    for finding in diagnosis.findings:
        by_heading[_group_heading(finding)].append(finding)
    for heading, findings in by_heading.items():
        lines.append(style(heading, bold=True))
        shown = findings if mismatch_cap is None else findings[:mismatch_cap]
        for finding in shown:
            lines.extend(_finding_lines(finding, verbose=verbose))
        if len(shown) < len(findings):
            lines.append(f"  ... {len(findings) - len(shown)} more (raise --mismatch-cap to see them)")
        lines.append("")
    lines.append(_loaded_line(analysis))
    return "\n".join(lines).rstrip() + "\n"


def _loaded_line(analysis: Analysis) -> str:
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
    wrapped = [d.rank for d in dumps if d.wrapped]
    if wrapped:
        parts.append(f"Ring buffer wrapped on {ranks_text(wrapped)}: only the overlap of windows was compared.")
    unusable = _unusable_files(analysis)
    if unusable:
        parts.append(f"Skipped {plural(len(unusable), 'unusable file')}: " + "; ".join(str(e) for e in unusable[:5]))
    if load.skipped:
        parts.append(f"Ignored {plural(len(load.skipped), 'unrelated file')}.")
    return "\n".join(parts)



# --------------------------------------------------------------------------- markdown


def render_markdown(analysis: Analysis, diagnosis: Diagnosis, mismatch_cap: Optional[int] = None) -> str:
    lines = [f"### frtrace: {STATUS_WORD[diagnosis.status]}", "", f"**{diagnosis.verdict}**", ""]
    if diagnosis.suspect_ranks:
        lines += [f"Suspect ranks: `{fold_ranks(diagnosis.suspect_ranks)}`", ""]
    if diagnosis.findings:
        lines += ["| severity | kind | group | op | seq | suspects | what |", "|---|---|---|---|---|---|---|"]
        per_group = Counter()
        for finding in diagnosis.findings:
            per_group[finding.group_id] += 1
            if mismatch_cap is not None and per_group[finding.group_id] > mismatch_cap:
                continue
            group = group_label(finding.pg_name, finding.pg_desc) or "-"
            seq = finding.collective_seq_id if finding.collective_seq_id is not None else finding.p2p_seq_id
            message = finding.message.replace("|", "\\|")
            lines.append(
                f"| {finding.severity} | {finding.kind}{'' if finding.is_root else ' (consequence)'} | {group} | "
                f"{finding.op or '-'} | {seq if seq is not None else '-'} | {fold_ranks(finding.suspect_ranks) or '-'} | {message} |"
            )
        lines.append("")
    lines += ["<details><summary>Inputs</summary>", "", _loaded_line(analysis), "", "</details>", ""]
    return "\n".join(lines)
