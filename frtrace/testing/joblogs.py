"""Synthetic job logs, written the way each torch version words its watchdog lines.

A dev tool for tests and benchmarks, never imported by the analyzer. Standard library
only. Usage:

    job = job_logs(world=16, era="2.6", fault="never_arrives", culprits=(5,))
    write_job_logs(job, "out/logs")      # files named as the layout says
    job.truth                            # {"suspects": [5], "status": "faults", ...}

Eras (`ERAS`) follow docs/logs.md: the c10 line header, the `WorkNCCL(...)` fields, the
watchdog's status line, the group prefix and the told-to-dump wording of that torch.
Faults:

* `never_arrives`: the culprits never enqueue op `seq` of the default group; everyone else
  times out in it. From 2.4 on, the culprits are told to dump and say their last enqueued
  work (`seq - 1`); before that they say nothing.
* `crash`: the culprits raise an exception (`CUDA out of memory`) at `seq - 1`; the others
  time out in `seq` one timeout later.
* `op_mismatch` / `size_mismatch`: the culprits time out in `seq` with BROADCAST / other
  numels while their peers time out in ALLREDUCE.
* `stuck`: everyone times out in `seq`; no rank can be named (inconclusive).
* `healthy`: training lines only.
* `missing_log`: as never_arrives, and the culprits' files are absent (per_rank layout).

Layouts: `combined` (one file, torchrun prefixes: `[rankN]:` from 2.2, `[defaultN]:`
before), `per_rank` (`rank_N.log`, no prefix), `slurm` (one file, `srun -l` prefixes),
`per_node` (`nodeNN.log`, torchrun prefixes). Noise: training lines, tqdm bars redrawn
with `\\r`, ANSI colour, and (`garble=True`) binary junk and a cut-off last line.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ERAS = ("1.9", "2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.13")
GPUS_PER_NODE = 8
TIMEOUT_MS = 600_000
_OPS_NUMEL = {"ALLREDUCE": (466119168, 466119168), "BROADCAST": (131072000, 131072000)}
# 2024-03-21 02:07:08 as the seconds the lines carry.
_T0 = (3, 21, 2 * 3600 + 7 * 60 + 8)


@dataclass
class JobLogs:
    files: dict[str, bytes]
    truth: dict = field(default_factory=dict)


def _era(era: str) -> tuple:
    return tuple(int(part) for part in era.split("."))


def host_of(rank: int) -> str:
    return f"node{rank // GPUS_PER_NODE + 1:02d}"


def _stamp(seconds: float) -> str:
    month, day, base = _T0
    total = base + seconds
    day += int(total // 86400)
    total %= 86400
    hh, rest = divmod(total, 3600)
    mm, ss = divmod(rest, 60)
    return f"{month}{day:02d} {int(hh):02d}:{int(mm):02d}:{int(ss):02d}.{int((ss % 1) * 1e9):09d}"


class _Writer:
    """The lines of one rank, in its era's wording."""

    def __init__(self, era: str, rank: int, world: int):
        self.era, self.v, self.rank, self.world = era, _era(era), rank, world

    def header(self, level: str, line: int, at: float) -> str:
        if self.v >= (2, 4):
            return f"[{level}{_stamp(at)} ProcessGroupNCCL.cpp:{line}] "
        return f"[{level} ProcessGroupNCCL.cpp:{line}] "

    def prefix(self) -> str:
        rank = self.rank
        if self.v >= (2, 5):
            return f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
        if self.v >= (2, 4):
            return f"[PG 0 (default_pg) Rank {rank}] "
        if self.v >= (2, 3):
            return f"[PG 0 Rank {rank}] "
        return f"[Rank {rank}] "

    def work(self, seq: int, op: str, numel: tuple) -> str:
        if self.v < (1, 10):
            return f"WorkNCCL(OpType={op}, TensorShape=[{numel[0]}], Timeout(ms)={TIMEOUT_MS})"
        if self.v < (2, 1):
            return f"WorkNCCL(SeqNum={seq}, OpType={op}, TensorShape=[{numel[0]}], Timeout(ms)={TIMEOUT_MS})"
        return f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel[0]}, NumelOut={numel[1]}, Timeout(ms)={TIMEOUT_MS})"

    def timeout(self, seq: int, op: str, numel: tuple, at: float, enqueued: int, completed: int) -> list[str]:
        work = self.work(seq, op, numel)
        lines = [self.header("E", 607, at) + f"[Rank {self.rank}] Watchdog caught collective operation timeout: "
                 f"{work} ran for {TIMEOUT_MS + 60} milliseconds before timing out."]
        status = self._status(seq, enqueued, completed)
        if status:
            lines.append(self.header("E", 1664, at + 0.0002) + self.prefix() + status)
        if self.v >= (2, 6):
            lines.append(self.header("E", 667, at + 0.0003) + "Stack trace of the failed collective not found, potentially "
                         "because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a "
                         "non-zero value.")
            lines.append(self.header("E", 2106, at + 0.0004) + self.prefix() + "First PG on this rank to signal dumping.")
        lines.append(self.header("E", 681, at + 0.0005) + f"[Rank {self.rank}] Some NCCL operations have failed or timed "
                     "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                     "corrupted/incomplete data.")
        lines.append(self.header("E", 695, at + 0.0006) + f"[Rank {self.rank}] To avoid data inconsistency, we are taking "
                     "the entire process down.")
        thread = "Process group watchdog thread" if self.v >= (2, 3) else "NCCL watchdog thread"
        lines.append("terminate called after throwing an instance of 'c10::DistBackendError'")
        lines.append(f"  what():  {self.prefix() if self.v >= (2, 3) else f'[Rank {self.rank}] '}{thread} terminated with "
                     f"exception: [Rank {self.rank}] Watchdog caught collective operation timeout: {work} ran for "
                     f"{TIMEOUT_MS + 60} milliseconds before timing out.")
        return lines

    def _status(self, seq: int, enqueued: int, completed: int) -> str:
        if self.v >= (2, 13):
            return (f" failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enqueued}, "
                    f"last started work: {seq} (ALLREDUCE), last completed work: {completed}")
        if self.v >= (2, 6):
            return (f" failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enqueued}, "
                    f"last completed work: {completed}")
        if self.v >= (2, 4):
            return (f"Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: "
                    f"{enqueued}, last completed NCCL work: {completed}.")
        if self.v >= (2, 2):
            return f"Timeout at NCCL work: {seq}, last enqueued NCCL work: {enqueued}, last completed NCCL work: {completed}."
        return ""

    def told(self, from_rank: int, at: float, enqueued: int, completed: int) -> list[str]:
        if self.v >= (2, 5):
            return [self.header("E", 1922, at) + self.prefix() + "Observed flight recorder dump signal from another rank "
                    "via TCPStore.",
                    self.header("E", 1987, at + 0.0003) + self.prefix() + "Received a dump signal due to a collective "
                    f"timeout from  rank {from_rank} and we will try our best to dump the debug info. Last enqueued NCCL "
                    f"work: {enqueued}, last completed NCCL work: {completed}.This is most likely caused by incorrect "
                    "usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for "
                    "all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused "
                    "by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. "
                    "NCCL), etc. "]
        if self.v >= (2, 4):
            return [self.header("E", 1316, at) + self.prefix() + "Received a global timeout from another rank and will "
                    f"start to dump the debug info. Last enqueued NCCL work: {enqueued}, last completed NCCL work: "
                    f"{completed}."]
        return []

    def nccl_init(self, pid: int) -> list[str]:
        where = f"{host_of(self.rank)}:{pid}:{pid + 40} [{self.rank % GPUS_PER_NODE}]"
        lines = [f"{where} NCCL INFO NCCL version 2.19.3+cuda12.3"] if self.rank % GPUS_PER_NODE == 0 else []
        lines.append(f"{where} NCCL INFO comm 0x55d2c{self.rank:05x} rank {self.rank} nranks {self.world} cudaDev "
                     f"{self.rank % GPUS_PER_NODE} nvmlDev {self.rank % GPUS_PER_NODE} busId 18000 commId 0x7a1f - Init COMPLETE")
        return lines

    def crash(self) -> list[str]:
        return ["Traceback (most recent call last):",
                '  File "/workspace/train.py", line 120, in <module>',
                "    main()",
                '  File "/workspace/train.py", line 88, in train_step',
                "    loss = model(batch)",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
                "79.15 GiB of which 842.32 MiB is free."]


def job_logs(world: int = 8, *, era: str = "2.6", fault: str = "never_arrives", culprits: tuple = (1,),
             seq: int = 1580, layout: str = "combined", nccl_info: bool = True, noise: int = 3, garble: bool = False,
             seed: int = 0) -> JobLogs:
    """A job's logs with the fault, in `layout`, and its truth."""
    rng = random.Random(seed)
    per_rank: dict[int, list[str]] = {}
    culprit_set = set(culprits)
    for rank in range(world):
        writer = _Writer(era, rank, world)
        lines = writer.nccl_init(4000 + rank) if nccl_info else []
        lines += _training(rank, rng, noise)
        lines += _story(writer, fault, rank, culprit_set, seq, world, rng)
        per_rank[rank] = lines
    files = _layout(per_rank, era, layout, world, fault, culprit_set, rng)
    if garble:
        files = {name: _garbled(data, rng) for name, data in files.items()}
    return JobLogs(files, _truth(fault, culprits, seq, world))


def _training(rank: int, rng: random.Random, noise: int) -> list[str]:
    lines = []
    for step in range(noise):
        lines.append(f"step {step} loss {rng.uniform(1, 3):.4f} lr 3.0e-04 grad_norm {rng.uniform(0.1, 2):.3f}")
        lines.append(f"Epoch 1:  {step * 10}%|\x1b[32m{'#' * step}\x1b[0m | {step}/{noise} [00:0{step}<00:10]\r")
    return lines


def _story(writer: _Writer, fault: str, rank: int, culprits: set, seq: int, world: int, rng: random.Random) -> list[str]:
    at = 1.0 + rng.uniform(0, 0.05)
    if fault == "healthy":
        return ["training finished"]
    if rank in culprits:
        if fault in ("never_arrives", "missing_log"):
            first = min(r for r in range(world) if r not in culprits)
            return writer.told(first, at + 0.3, seq - 1, seq - 1)
        if fault == "crash":
            return writer.crash()
        if fault == "op_mismatch":
            return writer.timeout(seq, "BROADCAST", _OPS_NUMEL["BROADCAST"], at, seq, seq - 1)
        if fault == "size_mismatch":
            return writer.timeout(seq, "ALLREDUCE", (1024, 1024), at, seq, seq - 1)
    return writer.timeout(seq, "ALLREDUCE", _OPS_NUMEL["ALLREDUCE"], at, seq + 2, seq - 1)


def _layout(per_rank: dict, era: str, layout: str, world: int, fault: str, culprits: set,
            rng: random.Random) -> dict[str, bytes]:
    v = _era(era)
    label = "rank" if v >= (2, 2) else "default"
    if layout == "per_rank":
        return {f"rank_{rank}.log": _text(lines) for rank, lines in per_rank.items()
                if not (fault == "missing_log" and rank in culprits)}
    if layout == "per_node":
        files: dict[str, list[str]] = {}
        for rank, lines in per_rank.items():
            files.setdefault(f"{host_of(rank)}.log", []).extend(
                f"[{label}{rank if label == 'rank' else rank % GPUS_PER_NODE}]:{line}" for line in lines)
        return {name: _text(lines) for name, lines in files.items()}
    if layout == "slurm":
        return {"slurm-4242.out": _text(_interleave({r: [f"{r}: {line}" for line in lines] for r, lines in per_rank.items()},
                                                    rng))}
    prefixed = {rank: [f"[{label}{rank}]:{line}" for line in lines] for rank, lines in per_rank.items()}
    merged = _interleave(prefixed, rng)
    if fault != "healthy" and v >= (1, 10):
        merged += _summary(per_rank, culprits, fault)
    return {"job.log": _text(merged)}


def _interleave(per_rank: dict, rng: random.Random) -> list[str]:
    """Lines of all ranks in one stream, each rank's in order, their order mixed."""
    queues = {rank: list(lines) for rank, lines in per_rank.items()}
    out = []
    while queues:
        rank = rng.choice(sorted(queues))
        out.append(queues[rank].pop(0))
        if not queues[rank]:
            del queues[rank]
    return out


def _summary(per_rank: dict, culprits: set, fault: str) -> list[str]:
    first = min(culprits) if fault == "crash" and culprits else min(r for r in per_rank if r not in culprits)
    code = "1" if fault == "crash" else "-6"
    return ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================",
            "train.py FAILED",
            "------------------------------------------------------------",
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            "------------------------------------------------------------",
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2024-03-21_02:17:09",
            f"  host      : {host_of(first)}",
            f"  rank      : {first} (local_rank: {first % GPUS_PER_NODE})",
            f"  exitcode  : {code} (pid: {4000 + first})",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================"]


def _text(lines: list[str]) -> bytes:
    return "".join(line if line.endswith("\r") else line + "\n" for line in lines).encode()


def _garbled(data: bytes, rng: random.Random) -> bytes:
    """Binary junk in the middle, and the last line cut off."""
    cut = data.find(b"\n", len(data) // 2) + 1
    junk = bytes(rng.randrange(256) for _ in range(200)).replace(b"\n", b"") + b"\n"
    body = data[:cut] + junk + data[cut:]
    return body[: len(body) - 30] if body.endswith(b"\n") else body


def _truth(fault: str, culprits: tuple, seq: int, world: int) -> dict:
    if fault == "healthy":
        return {"status": "healthy", "suspects": []}
    if fault == "stuck":
        return {"status": "inconclusive", "suspects": [], "seq": seq}
    return {"status": "faults", "suspects": sorted(culprits), "seq": seq}


def write_job_logs(job: JobLogs, directory, gzip_files: bool = False) -> Path:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name, data in job.files.items():
        if gzip_files:
            (root / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (root / name).write_bytes(data)
    return root


def one_file(job: JobLogs) -> Optional[bytes]:
    """The job's single file (combined and slurm layouts)."""
    return next(iter(job.files.values())) if len(job.files) == 1 else None
