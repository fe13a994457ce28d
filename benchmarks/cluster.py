#!/usr/bin/env python3
"""The local process pool against --scheduler (a Dask cluster) on one job, alternating.

    python benchmarks/cluster.py /tmp/frtrace-cluster-bench/r4096 --repeat 2 --workers 2
    python -m frtrace.testing.synth /tmp/frtrace-cluster-bench/r4096 --world-size 4096 --tp 8 --pp 4 \\
        --entries-per-rank 2000 --fault hang --fault-rank 1 --fault-step 100 --workers 2   # the job

Each measurement is a fresh subprocess (`--one MODE`) that runs pipeline.analyze, diagnose and
render_json in-process, and reports its wall time, its own peak RSS (RUSAGE_SELF: the client,
not the workers), and the md5 of the JSON report, which must be the same for every mode. Modes
(`--modes`, default all): `pool` (--workers N local processes); `dask` (a LocalCluster of N
worker processes, started inside the measurement: its start-up is included and reported apart;
the entries come back to this process, as with --logs); `remote` (the same cluster, the report
made on a worker, `frtrace.api.on_cluster`, as the CLI runs --scheduler: this process holds no
entry). With `--with-files`, each mode also writes a SQLite database and a timeline (as `-o
db.sqlite --timeline trace.json`: under `remote` they are made on the worker and only their bytes
come back), and their md5s join the report's. Also measured once: the
bytes that travel per rank (a job to a worker; a worker's result back, pickled as both paths
send it). Prints a markdown table; standard library plus frtrace (and dask for `dask`).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import pickle
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


# pool: the local process pool; dask: the entries read on a cluster come back to this
# process (as --scheduler with --logs); remote: --scheduler as the CLI runs it, the report
# and the files made on the cluster (frtrace.api.on_cluster).
MODES = ("pool", "dask", "remote")


def one(mode: str, directory: str, workers: int, files_to: str = "") -> dict:
    from frtrace.api import on_cluster
    from frtrace.cli.remote import OutputRequest, ReportRequest, report_on_worker
    from frtrace.cli.render import RenderOptions
    from frtrace.diagnosis import diagnose
    from frtrace.export.outputs import write_made_output, write_output
    from frtrace.export.paths import DATABASE, TIMELINE, plan_output
    from frtrace.match.analysis import analyze
    from frtrace.report.render import render_json

    targets = tuple(plan_output(Path(files_to) / f"{mode}.{name}", kind, force=True)
                    for name, kind in (("sqlite", DATABASE), ("trace.json", TIMELINE))) if files_to else ()

    started = time.perf_counter()
    connect_seconds = 0.0
    scheduler = None
    if mode in ("dask", "remote"):
        from frtrace.load import cluster

        connect = cluster.DaskRunner.connect

        def timed_connect(address):
            nonlocal connect_seconds
            t0 = time.perf_counter()
            runner = connect(address)
            connect_seconds = time.perf_counter() - t0
            return runner

        cluster.DaskRunner.connect = timed_connect
        scheduler = f"local:{workers}"
    if mode == "remote":  # as the CLI runs --scheduler without --logs
        request = ReportRequest("json", False, RenderOptions(), False, OutputRequest(targets))
        def receive(outcome, files):  # as the CLI writes the files made on the worker
            for made in outcome.outputs:
                write_made_output(made.target, files.read(made.file))
                files.discard(made.file)

        report = on_cluster([directory], functools.partial(report_on_worker, request), scheduler=scheduler,
                            receive=receive).report
    else:
        analysis = analyze([directory], workers=workers, scheduler=scheduler)
        diagnosis = diagnose(analysis)
        for target in targets:
            write_output(target, target.kind, analysis, diagnosis)
        report = render_json(analysis, diagnosis)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before parsing or hashing anything here
    files_md5 = "".join(_md5_of_file(target.path)[:4] for target in targets)
    parsed = json.loads(report)
    return {"mode": mode, "seconds": seconds, "connect_seconds": connect_seconds, "client_peak_mb": peak_mb,
            "md5": hashlib.md5(report.encode()).hexdigest()[:8] + files_md5, "ranks": len(parsed["inputs"]["ranks_found"]),
            "suspects": parsed["suspect_ranks"]}


def _md5_of_file(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def transfer_bytes(directory: str, sample: int = 64) -> dict:
    from frtrace.load.loader import (
        DEFAULT_MAX_FILE_BYTES,
        _load_batch_for_transfer,
        discover_dump_files,
    )

    files = discover_dump_files([Path(directory)]).files[:sample]
    jobs = [(rank, str(path), DEFAULT_MAX_FILE_BYTES, False) for rank, path in files]
    results = [_load_batch_for_transfer([job]) for job in jobs]
    sizes = [Path(path).stat().st_size for _, path in files]
    return {"file_bytes_per_rank": statistics.mean(sizes),
            "job_bytes_per_rank": statistics.mean(len(pickle.dumps([job], protocol=5)) for job in jobs),
            "result_bytes_per_rank": statistics.mean(len(pickle.dumps(r, protocol=5)) for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--with-files", metavar="DIR", default="",
                        help="also write a SQLite database and a timeline into DIR (overwritten)")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.directory, args.workers, args.with_files)))
        return 0
    rows = []
    for repeat in range(args.repeat):
        for mode in args.modes:
            done = subprocess.run([sys.executable, __file__, args.directory, "--workers", str(args.workers),
                                   "--with-files", args.with_files, "--one", mode], capture_output=True, text=True)
            if done.returncode:
                print(done.stderr, file=sys.stderr)
                return 1
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"[{time.strftime('%H:%M:%S')}] {rows[-1]}", file=sys.stderr, flush=True)
    sizes = transfer_bytes(args.directory)
    print(f"| run | mode | ranks | seconds (dask start-up) | client peak MB | md5 (report{', files' * bool(args.with_files)}) |")
    print("|---|---|---|---|---|---|")
    for index, row in enumerate(rows):
        startup = f" ({row['connect_seconds']:.1f})" if row["mode"] != "pool" else ""
        print(f"| {index // len(args.modes) + 1} | {row['mode']} | {row['ranks']} | {row['seconds']:.1f}{startup} | "
              f"{row['client_peak_mb']:.0f} | {row['md5']} |")
    print(f"\nper rank: file {sizes['file_bytes_per_rank'] / 1024:.0f} KiB, job sent {sizes['job_bytes_per_rank']:.0f} B, "
          f"result back {sizes['result_bytes_per_rank'] / 1024:.1f} KiB")
    print("identical reports:", len({row["md5"] for row in rows}) == 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
