"""The verdict: status, primary suspects and the one line that leads every report.

Takes `Facts` and every finding; returns the `Diagnosis` with findings in report order
(roots first, oldest first; then consequences; then warnings and notes).
"""

from __future__ import annotations

from frtrace.diagnosis.facts import Facts
from frtrace.diagnosis.finding import Diagnosis, Finding
from frtrace.diagnosis.kinds import kind
from frtrace.util import plural

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def conclude(facts: Facts, findings: list[Finding]) -> Diagnosis:
    ordered = sorted(findings, key=_report_order)
    roots = [f for f in ordered if f.is_root and f.severity in ("error", "warning") and f.suspect_ranks
             and kind(f.kind).decides_fault]
    errors = [f for f in roots if f.severity == "error"]
    primary = errors or roots
    status = "faults" if primary else ("inconclusive" if _evidence_is_lacking(facts, ordered) else "healthy")
    suspects = tuple(sorted({r for f in primary for r in f.suspect_ranks}))
    return Diagnosis(status, suspects, _verdict_line(status, primary, facts, ordered), ordered)


def _report_order(f: Finding) -> tuple[bool, int, int, int, str]:
    # Roots and warnings oldest first (where a hang most often starts); notes by group,
    # which is how a reader looks one up among many alike.
    age = f.age_ns if f.severity != "info" else 0
    return (not f.is_root, _SEVERITY_ORDER[f.severity], age, f.group_id if f.group_id is not None else -1, f.kind)


def _evidence_is_lacking(facts: Facts, findings: list[Finding]) -> bool:
    analysis = facts.analysis
    return bool(analysis.layout.ranks_missing or analysis.load.errors or analysis.layout.ignored_files
                or any(f.severity == "warning" and kind(f.kind).decides_fault for f in findings))


def _verdict_line(status: str, roots: list[Finding], facts: Facts, findings: list[Finding]) -> str:
    layout = facts.analysis.layout
    if status == "healthy":
        ops = len(facts.analysis.matches.collectives)
        notes = [f.message for f in findings if f.severity == "warning"]
        return (f"HEALTHY: {plural(len(layout.ranks_found), 'rank')}, {plural(len(layout.groups), 'group')}, "
                f"{plural(ops, 'collective')} matched; no divergence, nothing stuck"
                + (f"; warning: {notes[0]}" if notes else ""))
    if status == "inconclusive":
        notes = [f.message for f in findings if f.severity in ("warning", "info")]
        return "INCONCLUSIVE: " + (notes[0] if notes else "not enough evidence in the dumps")
    first = roots[0]
    more = f" (+{plural(len(roots) - 1, 'more root finding')})" if len(roots) > 1 else ""
    return f"FAULT: {first.message}{more}"
