"""Small helpers shared by the stages: rank-range folding and parsing, sizes in words and in bytes (`512M`),
and a pause of the cyclic garbage collector."""

from __future__ import annotations

import contextlib
import gc
import math
from typing import Any, Iterable, Iterator, Mapping, TypeVar

# A node of a graph (strong_components): anything hashable that sorts.
Node = TypeVar("Node", bound=Any)


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


def shortened(text: str, limit: int = 400) -> str:
    """`text`, or when longer than `limit` characters its start and end around `...`: a
    deep path shown this way keeps its file name (and the rank in it). For display only."""
    if len(text) <= limit:
        return text
    head = (limit - 3) // 3
    return text[:head] + "..." + text[len(text) - (limit - 3 - head):]


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


def parse_rank_ranges(text: str, limit: int) -> tuple[range, ...]:
    """`(range(0, 2), range(8, 9))` for `'0 1,8'` or `'0-1 8'`: ranges, never expanded, so
    `0-100000000` costs nothing. ValueError (with a message for the user) for anything
    that is not rank numbers below `limit`."""
    ranges = []
    for part in text.replace(",", " ").split():
        low_text, dash, high_text = part.partition("-")
        if not low_text.isdigit() or (dash and not high_text.isdigit()):
            raise ValueError(f"takes rank numbers such as '0 1' or 0-3, not {part!r}")
        low, high = int(low_text), int(high_text) if dash else int(low_text)
        if low > high:
            raise ValueError(f"range {part!r} runs backwards")
        if high >= limit:
            raise ValueError(f"rank {high} is beyond any job (ranks go up to {limit - 1})")
        ranges.append(range(low, high + 1))
    if not ranges:
        raise ValueError("needs at least one rank number")
    return tuple(ranges)


def ranks_in(ranges: Iterable[range], ranks: Iterable[int]) -> list[int]:
    """The sorted `ranks` that fall in any of `ranges`."""
    ranges = tuple(ranges)
    return sorted(rank for rank in set(ranks) if any(rank in span for span in ranges))


SIZE_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """Bytes in `text` (`512M`, `4G`, `1.5k`, `100`); ValueError unless it is a positive size."""
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in SIZE_UNITS:
        number = float(text[:-1])
        if not math.isfinite(number):  # int() of 'infM' would raise OverflowError, not ValueError
            raise ValueError(f"not a finite size: {text!r}")
        size = int(number * SIZE_UNITS[text[-1]])
    else:
        size = int(text)
    # A limit of zero or less would refuse every file, which is never what was meant.
    if size <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return size


def install_hint(*extras: str) -> str:
    """How to install an extra, as every message that names one says it: frtrace has no
    release on PyPI yet, so from a checkout (`pip install '.[s3]'`)."""
    names = " or ".join(extras)
    commands = " or ".join(f"'.[{extra}]'" for extra in extras)
    published = " / ".join(f"frtrace[{extra}]" for extra in extras)
    return (f"install the {names} extra: pip install {commands} in a checkout of frtrace "
            f"({published} once it is released on PyPI)")


def strong_components(graph: Mapping[Node, Iterable[Node]]) -> list[list[Node]]:
    """Tarjan's strongly connected components of `graph` (node -> the nodes it points to),
    iteratively (a blocked pipeline can chain thousands of ranks: no recursion limit);
    edges to nodes outside it are ignored. Nodes are visited in sorted order, so the
    components come out the same on every run."""
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on_stack: set[Node] = set()
    components: list[list[Node]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, neighbours = work[-1]
            advanced = False
            for nxt in neighbours:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components
