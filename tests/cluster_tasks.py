"""Tasks for tests/test_cluster.py that dask workers import (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import os

from frtrace.load.loader import _load_batch_for_transfer

DOOMED_RANK = 3


def die_on_doomed_rank(batch: list, deal: bool = False) -> list:
    """The loader's task, except that the worker reading rank 3 dies (as of the OOM killer)."""
    if any(job[0] == DOOMED_RANK for job in batch):
        os._exit(1)
    return _load_batch_for_transfer(batch, deal)
