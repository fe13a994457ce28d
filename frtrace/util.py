"""Small helpers shared by the stages: rank-range folding, sizes in words, and a
pause of the cyclic garbage collector."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterable, Iterator


def fold_ranks(ranks: Iterable[int]) -> str:
    """`0-11,13-15` for 0..11 and 13..15; sorted and de-duplicated."""
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    parts = []
    start = prev = ordered[0]
    for rank in ordered[1:] + [None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(parts)


def plural(count: int, word: str, many: str = "") -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Build many acyclic containers without the cyclic collector rescanning them
    (reference counting frees them all); the previous setting is restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
