"""The import graph has no cycle: not between autotune's packages, not between two modules.

The layers themselves are import-linter's contract in pyproject.toml (``make check`` runs
``lint-imports``); this test reads the same graph with grimp, import-linter's own library, and names
every cycle it finds, file to file.
"""

from __future__ import annotations

import grimp
import pytest

# Cycles known and owned elsewhere; a cycle not listed here fails the test.
KNOWN: list[frozenset[str]] = []


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("autotune", exclude_type_checking_imports=True)


def _modules(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def _package(module: str) -> str:
    """The top-level part of autotune a module belongs to: ``autotune.caches._key`` -> ``autotune.caches``."""
    return ".".join(module.split(".")[:2])


def _packages(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for importer, imported in _modules(graph).items():
        edges.setdefault(_package(importer), set())
        for target in imported:
            # the root package's __init__ is the public face every layer may name (``__version__``)
            if _package(target) != _package(importer) and target != "autotune":
                edges[_package(importer)].add(_package(target))
    return edges


def _explain(graph: grimp.ImportGraph, cycle: frozenset[str], edges: dict[str, set[str]]) -> str:
    lines = []
    for a in sorted(cycle):
        for b in sorted(edges[a] & cycle):
            lines.append(f"  {a} -> {b}")
    return "\n".join(lines)


def test_no_module_imports_itself_through_others(graph):
    edges = _modules(graph)
    new = [c for c in _cycles(edges) if c not in KNOWN]
    assert not new, "import cycles between modules:\n" + "\n\n".join(_explain(graph, c, edges) for c in new)


def test_no_package_imports_itself_through_others(graph):
    edges = _packages(graph)
    found = _cycles(edges)
    assert not found, "import cycles between packages:\n" + "\n\n".join(_explain(graph, c, edges) for c in found)


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert sorted(map(sorted, _cycles(edges))) == [["a", "b", "c"], ["d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
