"""The package's shape: no module imports another that imports it back, however far round,
and no module outside frtrace/table/ reads the column store's internals.

(`lint-imports` in .ci/run checks the layer order itself, from pyproject.toml.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import frtrace
from frtrace.util import strong_components

PACKAGE_ROOT = Path(frtrace.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """Every frtrace module `path` imports, at the top or inside a function."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE_ROOT.rglob("*.py")}
    known = set(paths)
    return {name: _imported_modules(path, name, known) for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module."""
    return sorted(sorted(component) for component in strong_components(graph) if len(component) > 1)


def test_no_import_cycle():
    graph = _import_graph()
    # The root package re-exports the API, which imports everything: it is the top, not a layer.
    graph.pop("frtrace", None)
    for imports in graph.values():
        imports.discard("frtrace")
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_layer_is_a_package_with_a_docstring():
    for layer in ("table", "load", "match", "diagnosis", "report", "export", "cli"):
        init = PACKAGE_ROOT / layer / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{layer}/__init__.py says what it takes and returns"


# The store's own attributes that only frtrace/table/ reads: an EntryTable's codes and
# static rows by code (public there, for the package's own modules), and every private
# attribute its classes keep (a SeqMap's rows and numbers, a RowList's rows ...). The
# layers above ask the named questions (EntryTable.static_row, SeqMap.first_rows ...).
TABLE_ONLY = frozenset({"codes", "statics"})
TABLE_PACKAGE = PACKAGE_ROOT / "table"


def _private_attributes_of_table() -> set[str]:
    """Every `_name` that frtrace/table/ keeps on its objects: assigned to self, or in __slots__."""
    found: set[str] = set()
    for path in TABLE_PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                found.add(node.attr)
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
                found.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("_"))
    return {name for name in found if not name.startswith("__")}


def internal_reads(source: str, internals: frozenset[str] | set[str], filename: str = "<source>") -> list[str]:
    """`line: expression` for each read of one of `internals` off an object other than
    self or cls, and each private name imported from frtrace.table."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and node.attr in internals:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("frtrace.table"):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names if alias.name.startswith("_")]
    return found


def test_only_the_table_package_reads_the_stores_internals():
    internals = TABLE_ONLY | _private_attributes_of_table()
    assert {"_codes", "_statics", "_rows", "_seqs"} <= internals  # what the table keeps, as found
    reads = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if TABLE_PACKAGE in path.parents:
            continue
        found = internal_reads(path.read_text(), internals, str(path))
        if found:
            reads[str(path.relative_to(PACKAGE_ROOT))] = found
    assert reads == {}


def test_the_internal_read_finder_finds_internal_reads():
    source = (
        "from frtrace.table.entry_table import _new_entry\n"
        "def f(table, seq_map):\n"
        "    self_reads_are_its_own = self._rows\n"
        "    return table.codes[3], table.statics[0].name, seq_map._rows, table.static_row(3)\n"
    )
    assert sorted(internal_reads(source, TABLE_ONLY | {"_rows"})) == [
        "1: import _new_entry", "4: seq_map._rows", "4: table.codes", "4: table.statics"]


def test_the_cycle_finder_keeps_separate_cycles_apart_and_ignores_edges_out():
    graph = {"a": {"b"}, "b": {"a", "x"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}  # x is no node
    assert _cycles(graph) == [["a", "b"], ["c", "d"]]
