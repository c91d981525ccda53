"""No import cycles in or between the top-level packages (simulation/, deploy/, strategies/, clients/,
fedapp/), except a package's `__init__` with its own submodules.

Every import counts: module-level, function-level and `TYPE_CHECKING` ones. A package that imports its
submodules while a submodule imports a sibling through the package is the normal shape of a package; any
other cycle means two modules each need the other, and one of them holds the wrong code.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulation", "deploy", "strategies", "clients", "fedapp")

Graph = dict[str, set[str]]


def module_files(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` (a package is named by its `__init__`)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def is_package(module: str, modules: dict[str, Path]) -> bool:
    return modules[module].name == "__init__.py"


def imported_modules(module: str, source: str, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `module` imports anywhere (`from a.b import c`: `a.b.c` if that is
    a module, else `a.b`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, `level - 1` packages up
                anchor = module.split(".") if is_package(module, modules) else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> Graph:
    """Module -> the modules it imports, over all of `packages` together (so cycles between them show)."""
    modules = module_files(root, packages)
    return {name: imported_modules(name, path.read_text(), modules) for name, path in modules.items()}


def strongly_connected(nodes: Iterable[str], graph: Graph) -> list[set[str]]:
    """Tarjan's strongly connected components of `graph` restricted to `nodes` (iterative)."""
    members = set(nodes)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(members):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start] & members)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor] & members))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
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
                    components.append(component)
    return components


def enclosing_package(component: set[str]) -> str | None:
    """The package of `component` that every other member lies inside, if there is one."""
    for candidate in sorted(component):
        if all(member == candidate or member.startswith(candidate + ".") for member in component):
            return candidate
    return None


def a_cycle(component: set[str], graph: Graph) -> list[str]:
    """One shortest cycle through the first member of a strongly connected `component`."""
    start = min(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for successor in sorted(graph[node] & component):
            if successor == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if successor not in parent:
                parent[successor] = node
                queue.append(successor)
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def forbidden_cycles(graph: Graph, nodes: Iterable[str] | None = None) -> list[list[str]]:
    """One cycle per group of modules that import each other other than through their package.

    A component whose members all lie inside one of them, a package P, may cycle through P; what is
    left once P is taken out must be free of cycles in turn.
    """
    cycles = []
    for component in strongly_connected(graph if nodes is None else nodes, graph):
        if len(component) < 2:
            continue
        package = enclosing_package(component)
        if package is None:
            cycles.append(a_cycle(component, graph))
        else:
            cycles += forbidden_cycles(graph, component - {package})
    return cycles


def test_no_import_cycles_in_or_between_the_packages() -> None:
    graph = import_graph()
    assert {name.split(".")[0] for name in graph} == set(PACKAGES)
    cycles = forbidden_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def write_modules(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


def test_the_check_sees_function_level_cycles_and_allows_package_ones(tmp_path: Path) -> None:
    write_modules(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.data import load\n",
            "pkg/data/__init__.py": "from pkg.data.registry import load\n",
            "pkg/data/registry.py": "from pkg.data import texts\nfrom pkg.methods import METHODS\n",
            "pkg/data/texts.py": "def f():\n    from pkg.data.registry import load\n",
            "pkg/methods/__init__.py": "from .ccfc import Config\n",
            "pkg/methods/ccfc.py": "from pkg.methods import base\n",
            "pkg/methods/base.py": "",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.data.registry"] == {"pkg.data.texts", "pkg.methods"}
    assert graph["pkg.methods"] == {"pkg.methods.ccfc"}
    assert graph["pkg.methods.ccfc"] == {"pkg.methods.base"}
    assert forbidden_cycles(graph) == [["pkg.data.registry", "pkg.data.texts", "pkg.data.registry"]]
    write_modules(tmp_path, {"pkg/data/texts.py": "", "pkg/methods/base.py": "import pkg.methods\n"})
    assert forbidden_cycles(import_graph(tmp_path, ["pkg"])) == []  # package <-> its submodules only
    write_modules(tmp_path, {"pkg/methods/base.py": "from pkg.data import registry\n"})
    assert forbidden_cycles(import_graph(tmp_path, ["pkg"])) == [
        ["pkg.data.registry", "pkg.methods", "pkg.methods.ccfc", "pkg.methods.base", "pkg.data.registry"]
    ]


def test_the_check_sees_a_cycle_between_two_packages(tmp_path: Path) -> None:
    """A hidden circle like the one deploy/ and simulation/ once had: one side imports inside a function."""
    write_modules(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/cli.py": "def deploy():\n    from ops.local import main\n",
            "ops/__init__.py": "",
            "ops/local.py": "from app.cli import deploy\n",
        },
    )
    assert forbidden_cycles(import_graph(tmp_path, ["app", "ops"])) == [["app.cli", "ops.local", "app.cli"]]
    assert forbidden_cycles(import_graph(tmp_path, ["ops"])) == []  # one package alone cannot see it
