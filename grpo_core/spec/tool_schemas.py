"""A spec's ``tools:`` source turned into the JSON schemas a chat template renders (``tools=``),
read from the syntax tree: the service never runs a team's code outside the sandbox, so the
schema cannot come from the function object as transformers' ``get_json_schema`` takes it. The
result is the same for what that function accepts (tested against it): every top-level function
whose name does not start with ``_`` is a tool; each argument needs a type hint (``int``,
``float``, ``str``, ``bool``, ``list[...]``, ``tuple[...]``, ``dict[str, ...]``, ``Any``,
``Literal[...]``, ``X | None``/``Optional[X]``, unions of those) and a line under ``Args:`` in a
Google-style docstring; ``(choices: [...])`` at the end of that line makes an enum, a
``Returns:`` section describes the result.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from grpo_core.spec.source_checks import sandbox_source_tree

MAX_TOOLS = 32

_SCALARS = {
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "boolean",
    "None": "null",
    "list": "array",
    "tuple": "array",
    "dict": "object",
}
_JSON_TYPE_OF = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
# transformers' docstring sections (chat_template_utils): a description, then Args:, Returns:, Raises:.
_DESCRIPTION = re.compile(r"^(.*?)(?=\n\s*(Args:|Arguments:|Returns:|Raises:)|\Z)", re.DOTALL)
_ARGS = re.compile(r"\n\s*(?:Args|Arguments):\s*\n(.*?)(?=\n\s*(?:Returns|Raises):|\Z)", re.DOTALL)
_ARG_LINE = re.compile(
    r"(?:^|\n)\s*(\w+)(?:\s*\([^)]*?\))?:\s*(.*?)\s*(?=\n\s*\w+(?:\s*\([^)]*?\))?:|\Z)", re.DOTALL
)
_RETURNS = re.compile(r"\n\s*Returns:\s*\n(.*?)(?=\n\s*Raises:|\Z)", re.DOTALL)
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)


class ToolSourceError(ValueError):
    """What is wrong with a tools source, in words for the spec's error."""


@dataclass(frozen=True)
class ToolSet:
    """The tools of a spec: each source as given, and every tool's schema by name."""

    sources: tuple[str, ...]
    schemas: tuple[dict[str, Any], ...]

    @property
    def names(self) -> list[str]:
        return [schema["function"]["name"] for schema in self.schemas]


def tool_set(sources: list[str]) -> ToolSet:
    """The tools the sources define, checked (ToolSourceError naming the source's index and line)."""
    schemas: list[dict[str, Any]] = []
    for index, source in enumerate(sources):
        try:
            schemas += source_schemas(source)
        except ToolSourceError as exc:
            raise ToolSourceError(f"tools.{index}.source: {exc}") from None
    names = [schema["function"]["name"] for schema in schemas]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ToolSourceError(f"tools: more than one tool is named {repeated[0]!r}")
    if len(schemas) > MAX_TOOLS:
        raise ToolSourceError(f"tools: {len(schemas)} tools; at most {MAX_TOOLS}")
    return ToolSet(tuple(sources), tuple(schemas))


def source_schemas(source: str) -> list[dict[str, Any]]:
    """The schema of each public top-level function of ``source``, which must compile and import
    only the standard library (tools run in the sandbox the python graders use)."""
    try:
        tree = sandbox_source_tree(source, "tools.py", "tools")
    except ValueError as exc:
        raise ToolSourceError(str(exc)) from None
    functions = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    ]
    if not functions:
        raise ToolSourceError(
            "defines no tool: a tool is a top-level function (not async) whose name does not start with '_'"
        )
    return [function_schema(node) for node in functions]


def function_schema(node: ast.FunctionDef) -> dict[str, Any]:
    """One function's schema, as ``get_json_schema`` builds it from the function object."""
    name = node.name
    doc = ast.get_docstring(node)
    if not doc:
        raise ToolSourceError(
            f"line {node.lineno}: {name} has no docstring (it describes the tool to the model)"
        )
    description, arg_docs, returns = _docstring(doc.strip())
    params = node.args
    if params.vararg or params.kwarg or params.posonlyargs:
        raise ToolSourceError(
            f"line {node.lineno}: {name} may take only named arguments (no *args, **kwargs "
            "or positional-only ones): the model calls it with a JSON object"
        )
    args = params.args + params.kwonlyargs
    defaults = (
        [None] * (len(params.args) - len(params.defaults)) + list(params.defaults) + list(params.kw_defaults)
    )
    properties: dict[str, Any] = {}
    required = []
    for arg, default in zip(args, defaults, strict=True):
        if arg.annotation is None:
            raise ToolSourceError(f"line {arg.lineno}: argument {arg.arg} of {name} has no type hint")
        schema = _hint(arg.annotation, f"argument {arg.arg} of {name}")
        if arg.arg not in arg_docs:
            raise ToolSourceError(
                f"line {node.lineno}: the docstring of {name} does not describe argument "
                f"{arg.arg!r} (a line '{arg.arg}: ...' under 'Args:')"
            )
        text = arg_docs[arg.arg]
        if (choices := _CHOICES.search(text)) is not None:
            try:
                values = json.loads(choices.group(1))
            except ValueError:
                raise ToolSourceError(f"{name}: the choices of {arg.arg!r} are not a JSON list") from None
            schema["enum"] = [c.strip() if isinstance(c, str) else c for c in values]
            text = text[: choices.start()].strip()
        schema["description"] = text
        properties[arg.arg] = schema
        if default is None:
            required.append(arg.arg)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if node.returns is not None:
        try:
            result = _hint(node.returns, f"the result of {name}")
        except ToolSourceError:  # as transformers: a result hint it cannot write is left out
            result = None
        if result is not None:
            if returns is not None:
                result["description"] = returns
            function["return"] = result
    return {"type": "function", "function": function}


def _docstring(doc: str) -> tuple[str | None, dict[str, str], str | None]:
    description = _DESCRIPTION.search(doc)
    args = _ARGS.search(doc)
    returns = _RETURNS.search(doc)
    arg_docs: dict[str, str] = {}
    if args is not None:
        block = "\n".join(line for line in args.group(1).split("\n") if line.strip())
        arg_docs = {
            m.group(1): re.sub(r"\s*\n+\s*", " ", m.group(2).strip()) for m in _ARG_LINE.finditer(block)
        }
    return (
        description.group(1).strip() if description else None,
        arg_docs,
        returns.group(1).strip() if returns else None,
    )


def _hint(node: ast.expr, what: str) -> dict[str, Any]:
    """The JSON schema of a type hint written as ``node``."""
    if isinstance(node, ast.Constant) and node.value is None:
        return {"type": "null"}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted hint
        try:
            return _hint(ast.parse(node.value, mode="eval").body, what)
        except SyntaxError:
            raise ToolSourceError(f"{what}: the type hint {node.value!r} does not parse") from None
    name = _dotted(node)
    if name is not None:
        if name in ("Any", "typing.Any"):
            return {}
        if name in _SCALARS:
            return {"type": _SCALARS[name]}
        if name in ("List", "typing.List", "Tuple", "typing.Tuple"):
            return {"type": "array"}
        if name in ("Dict", "typing.Dict"):
            return {"type": "object"}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union(_members(node), what)
    if isinstance(node, ast.Subscript):
        outer = _dotted(node.value) or ""
        base = outer.removeprefix("typing.")
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Optional":
            return _union([args[0], ast.Constant(None)], what)
        if base == "Union":
            return _union(args, what)
        if base == "Literal":
            values = [a.value for a in args if isinstance(a, ast.Constant)]
            if len(values) != len(args) or any(type(v) not in _JSON_TYPE_OF for v in values):
                raise ToolSourceError(
                    f"{what}: Literal[...] may list only str, int, float, bool or None values"
                )
            return _enum(values)
        if base in ("list", "List"):
            return {"type": "array", "items": _hint(args[0], what)}
        if base in ("tuple", "Tuple"):
            if len(args) == 1 or any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in args):
                raise ToolSourceError(f"{what}: write a variable-length tuple as list[...]")
            return {"type": "array", "prefixItems": [_hint(a, what) for a in args]}
        if base in ("dict", "Dict"):
            out: dict[str, Any] = {"type": "object"}
            if len(args) == 2:
                out["additionalProperties"] = _hint(args[1], what)
            return out
    raise ToolSourceError(
        f"{what}: the type hint {ast.unparse(node)!r} cannot be written as JSON (use int, "
        "float, str, bool, list, tuple, dict, Any, Literal or unions of those)"
    )


def _members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    return [node]


def _union(members: list[ast.expr], what: str) -> dict[str, Any]:
    nullable = any(isinstance(m, ast.Constant) and m.value is None or _dotted(m) == "None" for m in members)
    subtypes = [
        _hint(m, what)
        for m in members
        if not (isinstance(m, ast.Constant) and m.value is None or _dotted(m) == "None")
    ]
    if len(subtypes) == 1:
        out = subtypes[0]
    elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
        names = sorted({s["type"] for s in subtypes})
        out = {"type": names[0] if len(names) == 1 else names}
    else:
        out = {"anyOf": subtypes}
    if nullable:
        out["nullable"] = True
    return out


def _enum(values: list[Any]) -> dict[str, Any]:
    kinds = list(dict.fromkeys(_JSON_TYPE_OF[type(v)] for v in values))
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None
