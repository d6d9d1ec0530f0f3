"""A ``multi`` grader's ``calculate_output``: arithmetic over its graders' scores, never Python.

The expression comes from a spec, so it is not evaluated as Python (``eval`` of a spec's text would
run whatever the text says). It is parsed by Python's own parser into a syntax tree, and only the
nodes of arithmetic are accepted: numbers, the graders' names, ``+ - * /``, ``^`` or ``**`` as a
power, unary minus and plus, parentheses and calls of ``min``, ``max``, ``abs``, ``floor``,
``ceil``, ``exp``, ``sqrt`` and ``log``. Anything else (an attribute, a subscript, a string, a
comparison, another function or name) is refused when the spec is checked, naming the text that is
not allowed. The accepted tree is then walked by :class:`Expression`, which does the arithmetic
itself with :mod:`math`; nothing of the tree reaches ``eval`` or ``compile``.

OpenAI writes a power as ``^``, which Python reads as a bitwise xor of lower precedence than
``+``. It is rewritten to ``**`` token by token (:mod:`tokenize`, so a ``^`` is only ever an
operator) before parsing, so ``a + b ^ 2`` is ``a + (b ** 2)`` and ``-a ^ 2`` is ``-(a ** 2)``,
as in mathematics.

A row whose arithmetic has no real answer (a division by zero, ``sqrt`` or ``log`` of a negative,
an overflow, a negative number to a fractional power) has no score: :class:`Unscorable`, which the
grader turns into an unscored row saying why.
"""

from __future__ import annotations

import ast
import io
import math
import tokenize
from collections.abc import Callable, Mapping

__all__ = ["FUNCTIONS", "MAX_DEPTH", "MAX_EXPRESSION_CHARS", "Expression", "Unscorable", "parse_expression"]

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 100  # of nested operations: far beyond a formula, far below Python's recursion limit


def _fmin(*values: float) -> float:
    return min(values)


def _fmax(*values: float) -> float:
    return max(values)


def _log(value: float, base: float | None = None) -> float:
    return math.log(value) if base is None else math.log(value, base)


# name -> (function, fewest arguments, most arguments; None: any number)
FUNCTIONS: dict[str, tuple[Callable[..., float], int, int | None]] = {
    "min": (_fmin, 1, None),
    "max": (_fmax, 1, None),
    "abs": (abs, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (_log, 1, 2),  # natural log, or log(x, base)
}
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    # math.pow, not **: a negative base to a fractional power is a ValueError, not a complex number.
    ast.Pow: math.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.USub: lambda a: -a, ast.UAdd: lambda a: a}
_ALLOWED = "grader names, numbers, + - * / ^, parentheses and " + ", ".join(FUNCTIONS)
_DESCRIBED = {ast.Attribute: "an attribute", ast.Subscript: "a subscript", ast.Compare: "a comparison",
              ast.BoolOp: "a boolean operator", ast.Lambda: "a lambda", ast.IfExp: "a conditional"}


_LAYOUT = (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)


class Unscorable(ArithmeticError):
    """The expression has no real value for this row (division by zero, a math domain error...)."""


def _powers_as_python(text: str) -> str:
    """``text`` with every ``^`` operator token written ``**`` (strings and names untouched)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as exc:  # unbalanced parentheses, a stray character
        raise ValueError(f"calculate_output does not parse: {exc.args[0]}") from None
    # Rebuilt from the tokens' text at their columns: one line, so a column is an index in it.
    out, end = [], 0
    for token in tokens:
        if token.type in _LAYOUT:
            continue
        if token.start[0] != 1:
            raise ValueError("calculate_output must be one line")
        start, stop = token.start[1], token.end[1]
        out.append(text[end:start])
        out.append("**" if token.type == tokenize.OP and token.string == "^" else token.string)
        end = stop
    out.append(text[end:])
    return "".join(out)


class Expression:
    """A checked ``calculate_output``: :meth:`value` of it for one row's grader scores."""

    def __init__(self, text: str, tree: ast.expr, names: frozenset[str]) -> None:
        self.text = text
        self._tree = tree
        self.names = names  # the graders it reads

    def value(self, scores: Mapping[str, float]) -> float:
        """The expression's value; :class:`Unscorable` when the arithmetic has none."""
        try:
            result = self._eval(self._tree, scores)
        except ZeroDivisionError:
            raise Unscorable("calculate_output divides by zero") from None
        except (ValueError, OverflowError) as exc:
            raise Unscorable(f"calculate_output has no real value here ({exc})") from None
        if not math.isfinite(result):
            raise Unscorable(f"calculate_output is {result} here")
        return result

    def _eval(self, node: ast.expr, scores: Mapping[str, float]) -> float:
        # Only the node types parse_expression let through can be here.
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return scores[node.id]
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](self._eval(node.left, scores), self._eval(node.right, scores))
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._eval(node.operand, scores))
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        function = FUNCTIONS[node.func.id][0]
        return float(function(*(self._eval(arg, scores) for arg in node.args)))


def _refuse(text: str, node: ast.AST, what: str) -> ValueError:
    segment = ast.get_source_segment(text, node) or type(node).__name__
    return ValueError(f"calculate_output: '{segment[:80]}' is {what}, which is not allowed; "
                      f"use {_ALLOWED}")


def _check(text: str, node: ast.AST, names: frozenset[str], used: set[str], depth: int = 0) -> None:
    """Raise for the first node that is not arithmetic over ``names``; numbers become floats."""
    if depth > MAX_DEPTH:
        raise ValueError(f"calculate_output: nested more than {MAX_DEPTH} operations deep")
    depth += 1
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _refuse(text, node, f"a {type(value).__name__} constant")
        try:
            node.value = float(value)
        except OverflowError:
            raise _refuse(text, node, "a number too large") from None
        return
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise _refuse(text, node, "a function not called")
        if node.id not in names:
            known = ", ".join(sorted(names))
            raise ValueError(f"calculate_output: '{node.id}' is not one of the graders ({known})")
        used.add(node.id)
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise _refuse(text, node, f"the operator {type(node.op).__name__}")
        _check(text, node.left, names, used, depth)
        _check(text, node.right, names, used, depth)
        return
    if isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise _refuse(text, node, f"the operator {type(node.op).__name__}")
        _check(text, node.operand, names, used, depth)
        return
    if isinstance(node, ast.Call):
        _check_call(text, node, names, used, depth)
        return
    raise _refuse(text, node, _DESCRIBED.get(type(node), f"a {type(node).__name__}"))


def _check_call(text: str, node: ast.Call, names: frozenset[str], used: set[str], depth: int) -> None:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        segment = ast.get_source_segment(text, node.func) or type(node.func).__name__
        raise ValueError(f"calculate_output: '{segment[:80]}' is not a function allowed here; "
                         f"use {_ALLOWED}")
    if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
        raise _refuse(text, node, "a call with keyword or starred arguments")
    _, fewest, most = FUNCTIONS[node.func.id]
    if len(node.args) < fewest or (most is not None and len(node.args) > most):
        count = str(fewest) if fewest == most else f"{fewest} or {most}" if most else f"at least {fewest}"
        raise ValueError(f"calculate_output: {node.func.id}() takes {count} argument(s), "
                         f"'{ast.get_source_segment(text, node)}' gives {len(node.args)}")
    for arg in node.args:
        _check(text, arg, names, used, depth)


def parse_expression(text: str, names: frozenset[str] | set[str]) -> Expression:
    """``text`` checked as arithmetic over the graders ``names`` (see the module's docstring);
    a ValueError naming ``calculate_output`` and the text that is not allowed."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"calculate_output: at most {MAX_EXPRESSION_CHARS} characters")
    if not text.strip():
        raise ValueError("calculate_output: empty; write an expression over the graders' names")
    python = _powers_as_python(text.strip())
    try:
        tree = ast.parse(python, mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as exc:  # too deep a nesting is one of these
        message = exc.msg if isinstance(exc, SyntaxError) else "nested too deeply"
        raise ValueError(f"calculate_output does not parse: {message}") from None
    used: set[str] = set()
    _check(python, tree.body, frozenset(names), used)
    return Expression(text, tree.body, frozenset(used))
