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
