"""The import graph of this project's modules, read from the source, and its cycles.

Every import statement counts, a lazy one inside a function too: a lazy import only hides a
cycle from Python's import machinery, not from a reader. Relative imports are resolved against
the importing module's package, and ``from pkg import name`` points at the module ``pkg.name``
when there is one, else at ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

Graph = dict[str, set[str]]


def project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> its file, for every ``.py`` under the ``packages`` of ``root``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or the closest package above it that is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _from_base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative ones resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(_known(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, path, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else _known(base, modules))
    return {target for target in targets if target and target != module}


def import_graph(root: Path, packages: tuple[str, ...]) -> Graph:
    """Each module of ``packages`` -> the modules of ``packages`` it imports."""
    modules = project_modules(root, packages)
    return {module: _targets(module, path, modules) for module, path in modules.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted), by Tarjan's
    algorithm, iterative so that a deep import chain cannot exhaust Python's stack."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)
