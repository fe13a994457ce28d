#!/usr/bin/env python3
"""Measure the timeline and SQLite outputs on one dump directory.

    python benchmarks/outputs.py DIR [--timeline-all] [--keep OUTDIR]

Analyses DIR once (as `frtrace DIR` does), then times writing the timeline (the default
choice of ranks, and with --timeline-all every rank) and the SQLite database, and
reports the timeline's size (gzipped and raw), processes, tracks, overflow tracks ("+N"
lanes), slices, instants and flow arrows, and the time of every SQL query in the
README's "Querying with SQL" section run against the database.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_queries(readme: Path = ROOT / "README.md") -> list:
    """(title, sql) of every ```sql block in the README's SQL section."""
    text = readme.read_text(encoding="utf-8")
    section = text[text.index("## Querying with SQL"):]
    section = section[: section.index("\n## ", 3)]
    out = []
    for match in re.finditer(r"\n([^\n]*)\n\n```sql\n(.*?)```", section, re.S):
        out.append((match.group(1).strip()[:60], match.group(2).strip()))
    return out


def timeline_stats(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        text = handle.read()
    trace = json.loads(text)
    events = trace["traceEvents"]
    phases = Counter(e["ph"] for e in events)
    tracks = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    overflow = [t for t in tracks if re.search(r" \+\d+$", t)]
    return {
        "gz_MB": round(path.stat().st_size / 1e6, 1), "raw_MB": round(len(text.encode()) / 1e6, 1),
        "processes": sum(1 for e in events if e["ph"] == "M" and e["name"] == "process_name"),
        "tracks": len(tracks), "overflow_tracks": len(overflow),
        "slices": phases["X"], "instants": phases["i"], "flows": phases["s"],
        "selection": trace["otherData"].get("selection"),
    }


def _timed_write(write) -> float:
    t0 = time.monotonic()
    write()
    seconds = time.monotonic() - t0
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir")
    parser.add_argument("--timeline-all", action="store_true", help="also draw every rank")
    parser.add_argument("--keep", help="directory for the outputs (default: a temporary one)")
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--skip-timeline", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from frtrace.diagnosis import diagnose
    from frtrace.export.sqlite import write_sqlite
    from frtrace.export.timeline import write_timeline
    from frtrace.match.analysis import analyze
    from frtrace.util import cyclic_gc_paused

    out = Path(args.keep or tempfile.mkdtemp(prefix="frtrace-outputs-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    analysis = analyze([args.dir], workers=os.cpu_count() or 1)
    diagnosis = diagnose(analysis)
    print(f"{args.dir}: {len(analysis.load.dumps)} ranks, {sum(len(d.entries) for d in analysis.load.dumps):,} "
          f"entries, status {diagnosis.status}; analysed in {time.monotonic() - t0:.1f} s")
    runs = [] if args.skip_timeline else [("default", False)] + ([("--timeline-all", True)] if args.timeline_all else [])
    for label, draw_all in runs:
        path = out / f"trace-{'all' if draw_all else 'default'}.json.gz"
        with cyclic_gc_paused():
            seconds = _timed_write(lambda: write_timeline(str(path), analysis, diagnosis, compress=True,
                                                                 draw_all=draw_all))
        print(f"timeline {label}: written in {seconds:.1f} s; {timeline_stats(path)}")
    if args.skip_sqlite:
        return 0
    db = out / "db.sqlite"
    if db.exists():
        db.unlink()
    with cyclic_gc_paused():
        seconds = _timed_write(lambda: write_sqlite(str(db), analysis, diagnosis))
    print(f"sqlite: {db.stat().st_size / 1e6:.0f} MB written in {seconds:.1f} s")
    conn = sqlite3.connect(db)
    for title, sql in readme_queries():
        t0 = time.monotonic()
        rows = conn.execute(sql).fetchall()
        print(f"  {time.monotonic() - t0:7.3f} s  {len(rows):6d} rows  {title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
