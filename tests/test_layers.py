"""The package's shape: no module imports another that imports it back, however far round.

(`lint-imports` in .ci/run checks the layer order itself, from pyproject.toml.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import frtrace

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
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


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
