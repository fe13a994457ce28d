#!/usr/bin/env python3
"""Scale benchmark: frtrace against a bare unpickle of the same files (and torchfrtrace).

    python benchmarks/run.py --ranks 64 128 256 512 --entries 2000
    python benchmarks/run.py --ranks 256 --profile 256 --keep
    python benchmarks/run.py --ranks 64 128 --torchfrtrace-bin /tmp/torchvenv/bin/torchfrtrace

For each job size, synthetic NCCL-shaped dumps (with stack frames) are generated once with
`python -m frtrace.testing.synth` into a cache directory (default /tmp/frtrace-bench, outside the repo:
they are big) and reused while the generator and the parameters are unchanged. Then, each in a
separate subprocess so that memory is per measurement:

  bare      benchmarks/bare_unpickle.py: `pickle.load` of every file in one process
  frtrace   `python -m frtrace -d DIR --format json` end to end (the `frtrace` console script
            without the pyenv/venv shim in front of it)
  phases    benchmarks/phases.py: wall time of load / build / match / diagnose / render
  torch     `torchfrtrace -p nccl_trace_rank_ DIR`, only with --torchfrtrace[-bin], with a timeout

Memory is reported two ways. `peak MB` is ru_maxrss from wait4() on that subprocess: the
largest resident set of any single process in its tree (with loader workers it is the largest
of parent and workers, NOT their sum). `tree MB` samples /proc every 0.1 s and sums the RSS of
the subprocess and all its descendants: an estimate of what the machine must really hold
(it may miss a short spike, and counts pages shared between forked processes twice).

Results: a markdown table on stdout, and results-<time>.md / .json (with every raw number,
command, exit code, the machine and its load) in --out (default benchmarks/out, git-ignored).
Standard library only; Linux for the /proc sampling (elsewhere only ru_maxrss is reported).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import pstats
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PREFIX = "nccl_trace_rank_"
PHASES = ("load", "build", "match", "diagnose", "render")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measuring


def _tree_rss(root: int) -> Optional[int]:
    """Summed RSS (bytes) of `root` and its descendants, from /proc/<pid>/stat; None without /proc."""
    parent_of, rss_of = {}, {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # the process ended meanwhile
        # "pid (comm) state ppid ... rss ..."; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        pid = int(name)
        parent_of[pid] = int(fields[1])
        rss_of[pid] = int(fields[21]) * PAGE
    if root not in rss_of:
        return 0
    children: dict = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss_of.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def _steal_seconds() -> Optional[float]:
    """CPU time the hypervisor gave to other guests, over all cores (/proc/stat); None if unknown."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class _TreeSampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak: Optional[int] = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            rss = _tree_rss(self.pid)
            if rss is None:
                return
            self.peak = max(self.peak or 0, rss)
            self.done.wait(self.interval)


def run_measured(cmd: list, stdout: Path, stderr: Path, timeout: Optional[float] = None) -> dict:
    """Run `cmd` in its own session; wall time, exit code, CPU and memory of it and its children."""
    stdout.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    timed_out = threading.Event()
    steal_before = _steal_seconds()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, start_new_session=True)
    sampler = _TreeSampler(proc.pid)
    sampler.start()

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group of the process we started, nothing else
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
        timer.start()
    try:
        # wait4 gives this child's own rusage, which includes the children it reaped (the loader's
        # workers): ru_maxrss is then the largest RSS of any process in the tree.
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        kill()
        raise
    finally:
        wall = time.perf_counter() - started
        if timer:
            timer.cancel()
        sampler.done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    steal_after = _steal_seconds()
    return {
        "cmd": [str(c) for c in cmd],
        "wall_s": wall,
        "rc": proc.returncode,
        "timeout": timed_out.is_set(),
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,  # Linux: kB
        "tree_peak_mb": sampler.peak / 2**20 if sampler.peak is not None else None,
        "loadavg_before": list(load_before) if load_before else None,
        # Other virtual machines on the same host: CPU stolen from this one while it ran.
        "steal_s": steal_after - steal_before if steal_before is not None and steal_after is not None else None,
    }


# --------------------------------------------------------------------------- dumps


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _steps_for(ranks: int, tp: int, pp: int, entries: int) -> int:
    code = ("import sys; from frtrace.testing.synth import steps_for_entries as s; "
            "print(s(*map(int, sys.argv[1:])))")
    out = subprocess.run([sys.executable, "-c", code, str(ranks), str(tp), str(pp), str(entries)],
                         cwd=REPO, check=True, capture_output=True, text=True)
    return int(out.stdout)


def ensure_dumps(args, ranks: int) -> tuple:
    """(dump directory, truth dict, generated now?) for one size, generating it if needed."""
    steps = _steps_for(ranks, args.tp, args.pp, args.entries)
    params = {
        "ranks": ranks, "entries_per_rank": args.entries, "steps": steps, "tp": args.tp, "pp": args.pp,
        "fault": args.fault, "fault_rank": args.fault_rank, "fault_group": args.fault_group,
        "seed": args.seed, "prefix": PREFIX, "frames": True,
        # A changed generator makes different files: never reuse across versions of it.
        "synth_sha256": _sha(REPO / "frtrace" / "testing" / "synth.py"),
    }
    key = f"r{ranks}-e{args.entries}-tp{args.tp}-pp{args.pp}-{args.fault}-s{args.seed}-{params['synth_sha256'][:8]}"
    root = Path(args.cache) / key
    dumps, truth_path, params_path = root / "dumps", root / "truth.json", root / "params.json"
    if params_path.exists() and dumps.is_dir():
        try:
            if json.loads(params_path.read_text()) == params:
                log(f"{ranks} ranks: reusing {dumps}")
                return dumps, json.loads(truth_path.read_text()), False
        except (OSError, ValueError):
            pass
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    cmd = [sys.executable, "-m", "frtrace.testing.synth", str(dumps), "--world-size", str(ranks), "--tp", str(args.tp),
           "--pp", str(args.pp), "--steps", str(steps), "--seed", str(args.seed), "--prefix", PREFIX,
           "--truth", str(truth_path), "--workers", str(args.gen_workers)]
    if args.fault != "healthy":
        # In the last step, so that every rank still holds about --entries entries.
        cmd += ["--fault", args.fault, "--fault-rank", str(args.fault_rank), "--fault-step", str(steps - 1)]
        if args.fault_group:
            cmd += ["--fault-group", args.fault_group]
    log(f"{ranks} ranks: generating {steps} steps into {dumps}")
    started = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True)
    log(f"{ranks} ranks: generated in {time.perf_counter() - started:.1f} s")
    params_path.write_text(json.dumps(params, indent=1, sort_keys=True) + "\n")  # written last: marks it complete
    return dumps, json.loads(truth_path.read_text()), True


def warm_page_cache(directory: Path) -> int:
    """Read every file once so that no measurement pays for the disk; returns the bytes read."""
    total = 0
    for path in sorted(directory.iterdir()):
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 22):
                total += len(chunk)
    return total


# --------------------------------------------------------------------------- one size


def _json_stdout(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _shorten(path: Path, keep: int = 200, limit: int = 5 << 20) -> int:
    """Cut a report over `limit` bytes (torchfrtrace writes tens of MB) to its head and tail;
    returns its line count."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    if len(data) > limit:
        cut = f"\n[... {len(lines) - 2 * keep:,} lines ({len(data):,} bytes in all) cut by benchmarks/run.py ...]\n\n"
        path.write_bytes(b"".join(lines[:keep]) + cut.encode() + b"".join(lines[-keep:]))
    return len(lines)


def find_torchfrtrace(args) -> Optional[str]:
    if args.torchfrtrace_bin:
        return args.torchfrtrace_bin
    if args.torchfrtrace:
        found = shutil.which("torchfrtrace")
        if not found:
            log("torchfrtrace is not on PATH: skipping it (give --torchfrtrace-bin PATH)")
        return found
    return None


def _round(args, ranks: int, dumps: Path, truth: dict, workers: list, runs: Path, tag: str) -> dict:
    """A bare unpickle in one process and in two, then frtrace end to end, one after the other."""
    log(f"{ranks} ranks: bare unpickle{tag}")
    bare = run_measured([sys.executable, str(HERE / "bare_unpickle.py"), str(dumps)],
                        runs / "bare.json", runs / "bare.err")
    bare["result"] = _json_stdout(runs / "bare.json")
    log(f"{ranks} ranks: bare unpickle, two processes{tag}")
    bare2 = run_measured([sys.executable, str(HERE / "bare_unpickle.py"), str(dumps), "--processes", "2"],
                         runs / "bare2.json", runs / "bare2.err")
    log(f"{ranks} ranks: frtrace end to end{tag}")
    cli = run_measured([sys.executable, "-m", "frtrace", "-d", str(dumps), "--format", "json", *workers],
                       runs / "frtrace.json", runs / "frtrace.err")
    report = _json_stdout(runs / "frtrace.json") or {}
    cli["status"], cli["suspect_ranks"] = report.get("status"), report.get("suspect_ranks")
    cli["verdict_matches_truth"] = (cli["status"] == truth.get("status")
                                    and cli["suspect_ranks"] == truth.get("suspect_ranks"))
    return {"bare": bare, "bare2": bare2, "frtrace": cli}


def _median_run(runs: list) -> dict:
    """The run of median wall time (the lower middle one of an even number)."""
    return sorted(runs, key=lambda run: run["wall_s"])[(len(runs) - 1) // 2]


def _ratio_cell(ratios: list) -> str:
    """The median ratio, with the range over the rounds when there were several."""
    if not ratios:
        return "—"
    middle = ratios[(len(ratios) - 1) // 2]
    return f"{middle:.2f}×" if len(ratios) == 1 else f"{middle:.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f})"


def bench_size(args, ranks: int, torchfrtrace: Optional[str]) -> dict:
    dumps, truth, generated = ensure_dumps(args, ranks)
    files = sorted(dumps.iterdir())
    result = {"ranks": ranks, "files": len(files), "dump_bytes": warm_page_cache(dumps),
              "dump_dir": str(dumps), "truth": {k: truth.get(k) for k in ("status", "fault_kind", "suspect_ranks")}}
    runs = args.runs_dir / f"r{ranks}"
    workers = ["--workers", str(args.workers)] if args.workers else []

    rounds = [_round(args, ranks, dumps, truth, workers, runs / f"round-{k + 1}" if args.repeat > 1 else runs,
                     f" (round {k + 1} of {args.repeat})" if args.repeat > 1 else "")
              for k in range(args.repeat)]
    result["rounds"] = rounds
    # Each figure is that of its median round; the ratios pair each round's runs, taken
    # minutes apart at most, which the machine's drift spoils less than runs far apart.
    for name in ("bare", "bare2", "frtrace"):
        result[name] = _median_run([r[name] for r in rounds])
    result["verdicts_match_truth"] = all(r["frtrace"]["verdict_matches_truth"] for r in rounds)
    result["entries"] = (result["bare"]["result"] or {}).get("entries")
    result["x_bare"] = sorted(r["frtrace"]["wall_s"] / r["bare"]["wall_s"] for r in rounds)
    result["x_bare2"] = sorted(r["frtrace"]["wall_s"] / r["bare2"]["wall_s"] for r in rounds)

    log(f"{ranks} ranks: frtrace phases")
    phases = run_measured([sys.executable, str(HERE / "phases.py"), str(dumps), *workers],
                          runs / "phases.json", runs / "phases.err")
    phases["result"] = _json_stdout(runs / "phases.json")
    result["phases"] = phases

    if torchfrtrace:
        log(f"{ranks} ranks: torchfrtrace (timeout {args.timeout:g} s)")
        cap = ["--mismatch_cap", str(args.torchfrtrace_mismatch_cap)] if args.torchfrtrace_mismatch_cap else []
        torch = run_measured([torchfrtrace, "-p", PREFIX, *cap, str(dumps)], runs / "torchfrtrace.out",
                             runs / "torchfrtrace.err", timeout=args.timeout)
        torch["stopped_early"] = b"Too many mismatches" in (runs / "torchfrtrace.err").read_bytes()
        torch["stderr_lines"] = _shorten(runs / "torchfrtrace.err")
        result["torchfrtrace"] = torch

    if ranks in (args.profile or ()):
        prof = args.runs_dir / f"profile-r{ranks}.prof"
        log(f"{ranks} ranks: cProfile of frtrace --workers 1 into {prof}")
        result["profile"] = run_measured(
            [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "frtrace", "-d", str(dumps),
             "--format", "json", "--workers", "1"], runs / "profile.json", runs / "profile.err")
        result["profile"]["top"] = write_profile_summary(prof, args.runs_dir / f"profile-r{ranks}.txt")

    if generated and not args.keep:
        shutil.rmtree(dumps.parent)
        log(f"{ranks} ranks: removed {dumps.parent} (--keep keeps it for the next run)")
    return result


def write_profile_summary(prof: Path, text_path: Path, top: int = 15) -> str:
    buffer = io.StringIO()
    for order in ("cumulative", "tottime"):
        buffer.write(f"==== top {top} by {order} ====\n")
        pstats.Stats(str(prof), stream=buffer).strip_dirs().sort_stats(order).print_stats(top)
    text_path.write_text(buffer.getvalue())
    return buffer.getvalue()


# --------------------------------------------------------------------------- table


def _f(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def table(results: list) -> str:
    head = ["ranks", "entries", "dump MB", "bare unpickle s", "bare ×2 procs s", "frtrace s", "peak MB", "tree MB",
            *(f"{p} s" for p in PHASES), "torchfrtrace s", "tft peak MB", "speed-up", "× bare", "× bare ×2",
            "µs/entry", "peak B/entry", "verdict"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---:|" * (len(head) - 1) + ":---|"]
    for r in results:
        cli, bare, bare2 = r["frtrace"], r["bare"], r.get("bare2")
        phase_s = ((r["phases"].get("result") or {}).get("seconds") or {})
        entries = r.get("entries")
        torch = r.get("torchfrtrace")
        if torch is None:
            tft_s = tft_mb = speedup = "—"
        elif torch["timeout"]:
            tft_s, tft_mb, speedup = f"timeout (>{torch['wall_s']:.0f})", _f(torch["peak_mb"], 0), f"> {torch['wall_s'] / cli['wall_s']:.0f}×"
        else:
            failed = "" if torch["rc"] == 0 else f" (rc {torch['rc']})"
            failed += " (stopped early)" if torch.get("stopped_early") else ""
            tft_s, tft_mb = _f(torch["wall_s"], 1) + failed, _f(torch["peak_mb"], 0)
            speedup = f"{torch['wall_s'] / cli['wall_s']:.1f}×"
        ok = cli["rc"] in (0, 1, 3) and not cli["timeout"]
        cells = [
            f"{r['ranks']:,}", f"{entries:,}" if entries else "—", _f(r["dump_bytes"] / 1e6, 0),
            _f(bare["wall_s"]), _f(bare2["wall_s"]) if bare2 else "—", _f(cli["wall_s"]) + ("" if ok else f" (rc {cli['rc']})"),
            # A run shorter than the sampling interval can slip past the sampler: the tree held
            # at least its largest process.
            _f(cli["peak_mb"], 0), _f(max(cli["tree_peak_mb"] or 0, cli["peak_mb"]), 0),
            *(_f(phase_s.get(p)) for p in PHASES), tft_s, tft_mb, speedup,
            _ratio_cell(r.get("x_bare") or [cli["wall_s"] / bare["wall_s"]]),
            _ratio_cell(r.get("x_bare2") or ([cli["wall_s"] / bare2["wall_s"]] if bare2 else [])),
            _f(cli["wall_s"] / entries * 1e6) if entries else "—",
            # What frtrace held at its peak, per entry (its largest process: the main one).
            _f(cli["peak_mb"] * 1e6 / entries, 0) if entries else "—",
            "ok" if r.get("verdicts_match_truth", cli["verdict_matches_truth"]) else f"WRONG ({cli['status']}, {cli['suspect_ranks']})",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def machine() -> dict:
    info = {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        with open("/proc/meminfo") as meminfo:
            info["mem_total_gb"] = round(int(meminfo.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as cpuinfo:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "frtrace"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        info["frtrace_commit"] = head + ("+dirty" if dirty else "")
    except OSError:
        pass
    return info


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/run.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See benchmarks/README.md for targets and measured results.")
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 128, 256, 512], help="job sizes (default: 64 128 256 512)")
    parser.add_argument("--entries", type=int, default=2000, help="entries per rank (default 2000, the FR ring buffer default)")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel size (default 8)")
    parser.add_argument("--pp", type=int, default=4, help="pipeline-parallel size (default 4); dp = ranks / (tp*pp)")
    parser.add_argument("--fault", default="hang",
                        help="fault injected in the last step, or 'healthy' (default: hang, the case frtrace exists for)")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-group", choices=("tp", "pp", "dp", "default"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, help="frtrace --workers (default: frtrace's own, the number of cores)")
    parser.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1, help="processes writing dumps")
    parser.add_argument("--cache", default="/tmp/frtrace-bench", help="where dumps are generated and reused (default /tmp/frtrace-bench)")
    parser.add_argument("--keep", action="store_true", help="keep dumps generated by this run in --cache for the next run")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="results directory (default benchmarks/out)")
    parser.add_argument("--torchfrtrace", action="store_true", help="also time torchfrtrace, if it is on PATH")
    parser.add_argument("--torchfrtrace-bin", help="path of the torchfrtrace executable (implies --torchfrtrace)")
    parser.add_argument("--torchfrtrace-mismatch-cap", type=int, metavar="N",
                        help="pass --mismatch_cap N to torchfrtrace. By default (10) it stops ALL matching as soon "
                             "as one group has more than 10 mismatches, which on these dumps happens early; a huge N "
                             "makes it analyse everything, as frtrace does")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before torchfrtrace is killed (default 600)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the bare unpickles and frtrace N times in turn at each size: the table shows each "
                             "figure's median round, and the median ratio with its range over the rounds")
    parser.add_argument("--profile", type=int, nargs="*", metavar="RANKS",
                        help="also run frtrace under cProfile (--workers 1) at these sizes; top 15 into --out")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    for ranks in args.ranks:
        if ranks % (args.tp * args.pp):
            parser.error(f"--ranks {ranks} is not a multiple of tp*pp = {args.tp * args.pp} (change --tp/--pp)")

    torchfrtrace = find_torchfrtrace(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.runs_dir = args.out / f"runs-{stamp}"  # every subprocess's stdout and stderr
    meta = {"started": _dt.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:], "machine": machine(),
            "loadavg_start": list(os.getloadavg()), "torchfrtrace": torchfrtrace,
            # With PYTHONDONTWRITEBYTECODE set, every run compiles frtrace (and click) from source.
            "env": {k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED")}}
    if torchfrtrace:
        log("torchfrtrace startup (--help), to tell import time from work")
        meta["torchfrtrace_startup"] = run_measured([torchfrtrace, "--help"], args.runs_dir / "tft-help.out",
                                                    args.runs_dir / "tft-help.err", timeout=args.timeout)
    results = []
    for ranks in args.ranks:
        results.append(bench_size(args, ranks, torchfrtrace))
        (args.out / f"results-{stamp}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    meta["loadavg_end"] = list(os.getloadavg())
    text = table(results)
    notes = (f"\n{meta['started']}, {meta['machine'].get('nproc')} cores, {meta['machine'].get('mem_total_gb')} GB, "
             f"frtrace {meta['machine'].get('frtrace_commit')}, load average {meta['loadavg_start'][0]:.2f} at start, "
             f"{meta['loadavg_end'][0]:.2f} at end; `{' '.join(['python', 'benchmarks/run.py', *sys.argv[1:]])}`\n")
    (args.out / f"results-{stamp}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (args.out / f"results-{stamp}.md").write_text(text + notes)
    print(text + notes)
    for r in results:
        if "profile" in r:
            print(r["profile"]["top"])
    log(f"results in {args.out}/results-{stamp}.{{md,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
