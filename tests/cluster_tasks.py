"""Tasks for tests/test_cluster.py that dask workers import (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import os

import frtrace

from frtrace.load.loader import _load_batch_for_transfer

DOOMED_RANK = 3


def die_on_doomed_rank(batch: list, deal: bool = False) -> list:
    """The loader's task, except that the worker reading rank 3 dies (as of the OOM killer)."""
    if any(job[0] == DOOMED_RANK for job in batch):
        os._exit(1)
    return _load_batch_for_transfer(batch, deal)


def status_and_worker_pid(analysis) -> tuple:
    """What frtrace.on_cluster runs on the worker in tests: the verdict, and where it ran."""
    diagnosis = frtrace.diagnose(analysis)
    return diagnosis.status, list(diagnosis.suspect_ranks), os.getpid()


def die(analysis) -> None:
    """What frtrace.on_cluster runs in a test where the worker holding the analysis dies."""
    os._exit(1)
