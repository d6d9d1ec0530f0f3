"""Checks of Python source a team submits (python graders, tools, environments), made on its
syntax tree only: the service parses such code and never runs it outside the sandbox."""

from __future__ import annotations

import ast
import sys

MAX_SOURCE_CHARS = 65536


# An except clause naming one of these catches a failed import: what it guards may fail.
_IMPORT_GUARDS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _guards_imports(node: ast.AST) -> bool:
    if not isinstance(node, ast.Try | ast.TryStar):
        return False
    for handler in node.handlers:
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(
            isinstance(name, ast.Name) and name.id in _IMPORT_GUARDS for name in caught
        ):
            return True
    return False


def outside_stdlib(tree: ast.Module) -> tuple[int, str] | None:
    """``(line, module)`` of the first import of something the standard library does not have
    (a relative import too: the grader is one file), leaving out imports a ``try`` guards. Walked
    without recursion: a tree that compiled may still be deeper than Python's recursion limit."""
    found: list[tuple[int, str]] = []
    pending: list[tuple[ast.AST, bool]] = [(tree, False)]
    while pending:
        node, guarded = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else ["." * node.level + (node.module or "")]
            )
            found += [
                (node.lineno, name)
                for name in names
                if not guarded
                and (name.startswith(".") or name.partition(".")[0] not in sys.stdlib_module_names)
            ]
        elif _guards_imports(node):
            assert isinstance(node, ast.Try | ast.TryStar)
            pending += [(statement, True) for statement in node.body]
            pending += [(part, guarded) for part in (*node.handlers, *node.orelse, *node.finalbody)]
        else:
            pending += [(child, guarded) for child in ast.iter_child_nodes(node)]
    return min(found, default=None)
