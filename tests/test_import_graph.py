"""The project's package dependency direction, read from the source with `ast` (nothing is imported).

    launch -> server -> engine -> models
    drafter -> engine, models
    benchmarks -> anything; nothing imports benchmarks

Every import counts: module-level, inside functions, under `if TYPE_CHECKING:` and
`importlib.import_module("pkg.mod")` with a literal name. Relative imports are resolved.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("models", "engine", "server", "drafter", "launch", "benchmarks")

# What each package may import from the others (DESIGN's direction). Anything not listed is a violation.
ALLOWED = {
    "models": set(),                                   # the bottom: no other project package
    "engine": {"models"},                              # never drafter, server, launch or benchmarks
    "server": {"engine", "models"},                    # never launch, drafter or benchmarks
    "drafter": {"engine", "models"},                   # a pipeline beside the server; never server/launch
    "launch": {"server", "engine", "models"},          # the top of the serving stack
    "benchmarks": set(PACKAGES) - {"benchmarks"},      # may use anything; nothing imports benchmarks
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.Module, module: str, is_package: bool):
    """(dotted name, line) for every import in the tree, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            yield name, node.lineno
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"):
            yield node.args[0].value, node.lineno


def import_edges() -> tuple[dict[tuple[str, str], list[str]], dict[tuple[str, str], list[str]]]:
    """(importer, imported) -> ["file:line", ...]: between packages, and between the modules of
    one package (`from engine.x import y` names module engine.x; a package name, its __init__)."""
    packages: dict[tuple[str, str], list[str]] = defaultdict(list)
    modules: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pkg in PACKAGES:
        files = {module_name(p): p for p in sorted((ROOT / pkg).rglob("*.py")) if "__pycache__" not in p.parts}
        for module, path in files.items():
            tree = ast.parse(path.read_text(), filename=str(path))
            for name, line in imported_names(tree, module, path.name == "__init__.py"):
                where = f"{path.relative_to(ROOT)}:{line}"
                target = name.split(".")[0]
                if target in PACKAGES and target != pkg:
                    packages[(pkg, target)].append(where)
                elif target == pkg and name in files and name != module:
                    modules[(module, name)].append(where)
    return dict(packages), dict(modules)


EDGES, MODULE_EDGES = import_edges()


def find_cycle(edges) -> list[str] | None:
    graph = defaultdict(set)
    for src, dst in edges:
        graph[src].add(dst)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_imports_at_every_level():
    """Guards the parser: known module-level and function-level edges are found."""
    for pkg in PACKAGES:
        assert (ROOT / pkg / "__init__.py").is_file(), pkg
    assert any(s.startswith("engine/decoder.py:") for s in EDGES[("engine", "models")])   # module level
    assert any(s.startswith("launch/cli.py:") for s in EDGES[("launch", "server")])       # inside run()
    assert find_cycle({("models", "engine"), ("engine", "models")}) == ["engine", "models", "engine"]
    assert find_cycle({("launch", "server"), ("server", "engine")}) is None


def test_no_package_level_cycle():
    cycle = find_cycle(EDGES)
    if cycle:
        where = {f"{a} -> {b}": EDGES[(a, b)][:3] for a, b in zip(cycle, cycle[1:])}
        pytest.fail(f"package import cycle {' -> '.join(cycle)}: {where}")


def test_no_module_level_cycle_inside_a_package():
    """e.g. engine.loading -> engine.process -> engine.loading."""
    cycle = find_cycle(MODULE_EDGES)
    if cycle:
        where = {f"{a} -> {b}": MODULE_EDGES[(a, b)][:3] for a, b in zip(cycle, cycle[1:])}
        pytest.fail(f"module import cycle {' -> '.join(cycle)}: {where}")


@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_imports_follow_the_design_direction(pkg):
    bad = {f"{pkg} -> {dst}": sites for (src, dst), sites in sorted(EDGES.items())
           if src == pkg and dst not in ALLOWED[pkg]}
    assert not bad, f"imports against the dependency direction: {bad}"


def test_nothing_imports_benchmarks():
    importers = {src: sites for (src, dst), sites in EDGES.items() if dst == "benchmarks"}
    assert not importers, f"benchmarks is imported by: {importers}"
