"""Every test that skips for want of the sandbox goes through ``sandbox_guard.needs_sandbox``, so
none of them skips silently in CI: a skip condition written on its own (``skipif(sandbox_problem()
is not None)``) forgets ``GRPO_CI`` and hides a broken sandbox there. Checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
GUARD = TESTS / "sandbox_guard.py"


def _mentions_the_sandbox(node: ast.AST) -> bool:
    return any(isinstance(inner, ast.Name | ast.Attribute) and "sandbox_problem" in ast.unparse(inner)
               for inner in ast.walk(node))


def _is_skip(call: ast.Call) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    return name in ("skipif", "skip", "importorskip")


def own_sandbox_skips(source: str) -> list[int]:
    """Lines of ``source`` that decide a skip on the sandbox themselves: a ``skipif`` whose
    condition asks ``sandbox_problem``, or an ``if`` on it that calls ``pytest.skip``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _is_skip(node) and any(map(_mentions_the_sandbox, node.args)):
            lines.append(node.lineno)
        if isinstance(node, ast.If) and _mentions_the_sandbox(node.test) and any(
                isinstance(inner, ast.Call) and _is_skip(inner)
                for statement in node.body for inner in ast.walk(statement)):
            lines.append(node.lineno)
    return lines


def test_the_check_finds_a_skip_written_on_its_own() -> None:
    assert own_sandbox_skips(
        "@pytest.mark.skipif(sandbox_problem() is not None, reason='x')\ndef test_a(): pass\n") == [1]
    assert own_sandbox_skips(
        "def test_b():\n    if sandbox.sandbox_problem():\n        pytest.skip('x')\n") == [2]
    assert own_sandbox_skips(
        "from sandbox_guard import needs_sandbox\n@needs_sandbox\ndef test_c(): pass\n") == []


def test_every_sandbox_skip_is_the_shared_guard() -> None:
    offenders = {str(path.relative_to(TESTS)): lines for path in sorted(TESTS.rglob("*.py")) if path != GUARD
                 and (lines := own_sandbox_skips(path.read_text()))}
    assert not offenders, f"use sandbox_guard.needs_sandbox instead of these skips (file: lines): {offenders}"
