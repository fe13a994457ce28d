"""Builders for small hand-made dumps, written the way the producers write them."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

FRAMES = [
    {"name": "all_reduce", "filename": "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
    {"name": "train_step", "filename": "/workspace/job/train.py", "line": 42},
]


def entry(seq: int, op: str = "all_reduce", *, record_id: int = None, pg=("0", "default_pg"), pg_id: int = 0,
          sizes=((16,),), dtype: str = "Float", state: str = "completed", backend: str = "nccl", p2p_seq: int = 0,
          time_ns: int = None, frames=FRAMES, **extra) -> dict:
    record = {
        "record_id": seq - 1 if record_id is None else record_id,
        "pg_id": pg_id,
        "process_group": tuple(pg),
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq,
        "profiling_name": f"{backend}:{op}",
        "time_created_ns": time_ns if time_ns is not None else 1_700_000_000_000_000_000 + seq * 1_000_000,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": [dtype] * len(sizes),
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": op.startswith(("send", "recv")),
        "thread_id": "1",
        "thread_name": "pt_nccl_watchdog",
        "frames": list(frames),
    }
    record.update(extra)
    return record


def dump(entries: list, *, ranks=None, version: str = "2.10") -> dict:
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(ranks)) if ranks is not None else "[]"}}
    return {"version": version, "pg_config": config, "pg_status": {}, "comm_lib_version": "2.27.5", "entries": entries}


def write_pickle(path: Path, data) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=2))
    return path


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def write_job(directory: Path, dumps_by_rank: dict, prefix: str = "rank_") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, data in dumps_by_rank.items():
        write_pickle(directory / f"{prefix}{rank}", data)
    return directory


# --------------------------------------------------------------------------- timed NCCL jobs

T0_NS = 1_700_000_000_000_000_000
MS_NS = 1_000_000


def _timed(record: dict, created_ms: float, completed_ms=None, skew_ns: int = 0) -> dict:
    """Set the times of an `entry()` record the way NCCL with timing on writes them."""
    created = T0_NS + int(created_ms * MS_NS) + skew_ns
    record["time_created_ns"] = created
    record["time_discovered_started_ns"] = created + 50_000
    if completed_ms is None:
        record.update(state="started", retired=False, duration_ms=None, time_discovered_completed_ns=None)
    else:
        completed = T0_NS + int(completed_ms * MS_NS) + skew_ns
        record.update(state="completed", retired=True, time_discovered_completed_ns=completed,
                      duration_ms=(completed - created - 50_000) / MS_NS)
    return record


def nccl_hang_dumps(world: int = 4, culprit: int = 3, skew_ns=None) -> dict:
    """rank -> dump of a timed NCCL job that hangs in all_reduce #4 of group 0.

    Every rank runs all_reduce #1-#3 in group "0" (#3 is enqueued before #2 has
    finished, so they overlap in time); ranks 0 and 1 also run an all_gather in
    group "1" (desc "tp") and a send 0->1 / recv 1<-0 pair; every rank but `culprit`
    then enqueues all_reduce #4 and waits in it. `skew_ns` maps a rank to the offset
    of its clock; a collective completes at the same true moment on every rank.
    """
    skew_ns = skew_ns or {}
    tp = ("1", "tp")
    dumps = {}
    for rank in range(world):
        skew = skew_ns.get(rank, 0)
        arrive = rank * 0.1  # ms: ranks reach each collective slightly apart
        records = [
            _timed(entry(1), 10 + arrive, 12, skew),
            _timed(entry(2), 20 + arrive, 23, skew),
            _timed(entry(3), 21 + arrive, 24, skew),
        ]
        if rank in (0, 1):
            records.append(_timed(entry(1, "all_gather", pg=tp, pg_id=1, sizes=((8,),)), 26 + arrive, 27, skew))
            op = "send 0->1" if rank == 0 else "recv 1<-0"
            records.append(_timed(entry(3, op, p2p_seq=1), 30 + arrive, 31, skew))
        if rank != culprit:
            records.append(_timed(entry(4), 40 + arrive, None, skew))
        for record_id, record in enumerate(records):
            record["record_id"] = record_id
        config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
        if rank in (0, 1):
            config["1"] = {"name": "1", "desc": "tp", "ranks": "[0, 1]"}
        dumps[rank] = {"version": "2.10", "pg_config": config, "pg_status": {}, "comm_lib_version": "2.27.5",
                       "entries": records}
    return dumps


def gloo_hang_dumps(world: int = 4, culprit: int = 3) -> dict:
    """rank -> dump of a gloo job: states stay `scheduled`, only `retired` tells
    completion, no completion times; `culprit` never issues all_reduce #4."""
    dumps = {}
    for rank in range(world):
        records = [entry(seq, backend="gloo", state="scheduled", retired=True, time_ns=T0_NS + seq * 3 * MS_NS + rank * 1000)
                   for seq in (1, 2, 3)]
        if rank != culprit:
            records.append(entry(4, backend="gloo", state="scheduled", retired=False, time_ns=T0_NS + 12 * MS_NS + rank * 1000))
        dumps[rank] = dump(records, ranks=range(world))
    return dumps
