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


def sandbox_source_tree(source: str, filename: str, what: str) -> ast.Module:
    """``source``'s syntax tree when it compiles and imports only the standard library (what the
    sandbox's interpreter has), else a ValueError saying what is wrong: a syntax error, or the
    import with its line. ``what`` names the code in that message ("python graders"). Parses,
    never runs."""
    try:
        tree = ast.parse(source, filename=filename)
        compile(tree, filename, "exec")
    except SyntaxError as exc:
        raise ValueError(f"does not compile: {exc.msg} (line {exc.lineno})") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # nesting too deep; a NUL byte
        raise ValueError(f"does not compile: {type(exc).__name__}") from None
    if (imported := outside_stdlib(tree)) is not None:
        line, module = imported
        release = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise ValueError(f"line {line} imports '{module}', which is not in the standard library of the "
                         f"sandbox's Python {release}: {what} run with the standard library only "
                         "(vendor what you need into 'source', or guard the import with try/except "
                         "ImportError)")
    return tree
