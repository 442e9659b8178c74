"""No import cycle between packages: hybrid's folders, its top-level modules and models/ form a layered graph.

The test reads every module's source (ast: module-level and function-level imports alike, which a lazy
import only hides from start-up, not from the design) and checks that the graph of packages -- hybrid/<sub>/
as one node, each top-level module of hybrid/ as one node, models/ as one -- has no cycle. Command modules
(the entry points a user runs: `hybrid`, `hybrid plan`, `hybrid convert`, `hybrid generate`, train.py) sit on
top: they may import any package (`hybrid plan --emit-args` runs train.py's own checks), and no other module
may import them. Imports under `if TYPE_CHECKING:` are annotations only and are skipped.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("hybrid", "models")
COMMANDS = {"hybrid.cli", "hybrid.planner.cli", "hybrid.convert.cli", "hybrid.train.main", "hybrid.train.__main__",
            "hybrid.generate.cli", "hybrid.generate.__main__"}


def module_files() -> dict[str, str]:
    """Dotted module name -> file, for every .py file of the packages."""
    out = {}
    for top in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel.removesuffix(".__init__")] = os.path.join(d, f)
    return out


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported(path: str, modules: dict[str, str]) -> set[str]:
    """The package modules a file imports (`from a.b import c` is a.b.c when that is a module, else a.b)."""
    tree = ast.parse(open(path).read(), path)
    skip = {id(n) for t in ast.walk(tree) if _type_checking_only(t) for b in t.body for n in ast.walk(b)}
    names = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            names += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            names += [f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in modules else n.module for a in n.names]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def package(module: str, modules: dict[str, str]) -> str:
    """hybrid.<sub> for a module inside a sub-package, hybrid.<mod> for a top-level module, models for models."""
    parts = module.split(".")
    if parts[0] == "models":
        return "models"
    if len(parts) >= 2 and modules.get(".".join(parts[:2]), "").endswith("__init__.py"):
        return ".".join(parts[:2])
    return module


def import_graph() -> tuple[dict[str, set[str]], dict[str, str]]:
    modules = module_files()
    return {m: imported(p, modules) - {m} for m, p in modules.items()}, modules


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def package_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """Package -> packages it imports (command modules' imports left out), and the module edges behind each."""
    graph, modules = import_graph()
    packages: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    for m, deps in graph.items():
        if m in COMMANDS:
            continue
        a = package(m, modules)
        packages[a]
        for d in deps:
            b = package(d, modules)
            if a != b:
                packages[a].add(b)
                why[(a, b)].append(f"{m} -> {d}")
    return packages, why


def test_no_import_cycle_between_packages():
    packages, why = package_graph()
    found = cycles(packages)
    detail = [edge for comp in found for a in comp for b in sorted(packages[a]) if b in comp for edge in why[(a, b)]]
    assert not found, f"import cycles between packages: {found}; edges: {detail}"


def test_no_module_imports_a_command():
    graph, _ = import_graph()
    _, modules = import_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if m not in COMMANDS for d in deps
                 if d in COMMANDS and package(m, modules) != package(d, modules))  # a package may export its own
    assert not bad, f"library modules import command modules: {bad}"


def test_the_walker_finds_a_cycle():
    """The check itself: a two-package cycle and a lazy (function-level) import are both seen."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph, modules = import_graph()
    assert "hybrid.comm" in graph["hybrid.mesh"]  # module-level
    assert "hybrid.planner.search" in graph["hybrid.train.args"]  # inside apply_auto_parallel
