"""Each fast path of the table and the matcher beside its plain twin, swapped in on demand.

Takes nothing; `plain_twins()` is a context in which every fast path that a module lists
in its `PLAIN_TWINS` (a function, or a class's method, by name -> its plain twin: same
arguments, same answers) runs as its twin. The tests run the matcher over both
(tests/test_fast_paths.py), and benchmarks/fast_paths.py times each fast path against
its twin: ARCHITECTURE.md says when a fast path may land.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Callable, Iterable, Iterator, Optional

# The modules whose fast paths have plain twins: those the analysis runs once the dumps
# are loaded, and those loading runs (each rank's table is built with them).
MODULES = ("frtrace.table.entry_table", "frtrace.table.seq_map", "frtrace.match.matcher")
LOADING_MODULES = ("frtrace.table.batches", "frtrace.load.normalise")


def fast_paths(modules: Iterable[str] = MODULES + LOADING_MODULES) -> dict[str, Callable[..., object]]:
    """"module:name" (a function, or Class.method) -> its plain twin, for every module of `modules`."""
    found: dict[str, Callable[..., object]] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name, twin in module.PLAIN_TWINS.items():
            found[f"{module_name}:{name}"] = twin
    return found


def _owner_and_attribute(path: str) -> tuple[object, str]:
    module_name, name = path.split(":")
    owner: object = importlib.import_module(module_name)
    *classes, attribute = name.split(".")
    for class_name in classes:
        owner = getattr(owner, class_name)
    return owner, attribute


@contextlib.contextmanager
def plain_twins(paths: Optional[Iterable[str]] = None) -> Iterator[None]:
    """Within the block, the fast paths `paths` ("module:name", see fast_paths; all of
    them by default) run as their plain twins; the fast ones come back after."""
    twins = fast_paths()
    chosen = list(twins) if paths is None else list(paths)
    saved = []
    try:
        for path in chosen:
            owner, attribute = _owner_and_attribute(path)
            saved.append((owner, attribute, owner.__dict__[attribute]))
            setattr(owner, attribute, twins[path])
        yield
    finally:
        for owner, attribute, fast in reversed(saved):
            setattr(owner, attribute, fast)
