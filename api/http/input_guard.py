"""Text no column can hold, refused once for every route before anything reaches SQL.

Postgres refuses NUL in text and JSON columns, and UTF-8 cannot encode a lone surrogate (which
``json.loads`` makes of ``"\\ud800"``): either one reaching a query was a 500. :class:`InputGuard`
reads the path, the query string and a JSON body before routing and answers 422 naming the
field (``q``, ``metrics``, ``rewards.0.args.x``). The same pass refuses what Python's JSON
parser fails on mid-route: nesting deeper than :data:`MAX_JSON_DEPTH` (a RecursionError) and
integers longer than Python converts (``sys.get_int_max_str_digits()``). Form fields (uploads,
which stream past this guard) and specs written in YAML meet the same rule where they are parsed
(:func:`text_problem` in :mod:`api.http.upload_body`, :func:`text_fault` in
:mod:`api.http.submission`).

A JSON body is screened on the event loop by byte patterns that every offending body must
hold (a ``\\u0000`` or surrogate escape, a digit run that long, more brackets than the depth
allowed); only a body the screen flags is parsed, in the threadpool, to find the field.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.http.error_responses import error_response, replay_body
from grpo_core.spec.spec_file import field_path

# Far deeper than any request of this API (a spec nests under ten levels); pydantic-core's own
# JSON parser stops at about as deep, so specs and other bodies meet the same bound.
MAX_JSON_DEPTH = 200
_INT_DIGITS = sys.get_int_max_str_digits() or 4300
_SUSPECT = re.compile(rb"\\u(?:0000|[dD][89abAB][0-9a-fA-F]{2})|[0-9]{%d}" % (_INT_DIGITS + 1))
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_PEEL_PASSES = 8
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why a column cannot hold ``text``, or None."""
    if "\x00" in text:
        return "must not contain a NUL character"
    if _SURROGATE.search(text):
        return "must not contain a lone surrogate (not Unicode text)"
    return None


def text_fault(value: Any, loc: tuple[Any, ...] = ()) -> tuple[str, str] | None:
    """``(field path, reason)`` of a string (or key) in ``value`` that no column can hold, or
    None when there is none. Iterative: a parsed body's depth is not bounded by Python's stack here."""
    pending: list[tuple[tuple[Any, ...], Any]] = [(loc, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            if reason := text_problem(item):
                return field_path(where) or "body", reason
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and (reason := text_problem(key)):
                    return field_path(where) or "body", f"a key {reason}"
                pending.append(((*where, key), inner))
        elif isinstance(item, list):
            pending.extend(((*where, index), inner) for index, inner in enumerate(item))
    return None


def json_fault(body: bytes) -> tuple[str, str] | None:
    """``(field, reason)`` for a JSON body no route can take whole, or None (also for one that
    is no JSON at all: the route says so in its own words)."""
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _depth(body) > MAX_JSON_DEPTH:
        return "body", f"nested deeper than {MAX_JSON_DEPTH} levels"
    if not _SUSPECT.search(body):
        return None
    try:
        parsed = json.loads(body)
    except RecursionError:
        return "body", f"nested deeper than {MAX_JSON_DEPTH} levels"
    except json.JSONDecodeError:
        return None
    except ValueError:  # the integer length limit (its message names sys.set_int_max_str_digits)
        return "body", f"an integer has more than {_INT_DIGITS} digits"
    return text_fault(parsed)


def _depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects, brackets inside strings not counted; stops
    counting past :data:`MAX_JSON_DEPTH`. A few passes drop the innermost pairs at C speed (a
    spec's tens of thousands of brackets are gone in as many passes as it is deep); what is left
    is counted bracket by bracket, which stops as soon as it passes the limit."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    peeled = 0
    while brackets and peeled < _PEEL_PASSES:
        brackets, peeled = brackets.replace(b"[]", b"").replace(b"{}", b""), peeled + 1
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
        if deepest + peeled > MAX_JSON_DEPTH:
            break
    return deepest + peeled if brackets else peeled


def _query_fault(query_string: bytes) -> tuple[str, str] | None:
    # Decoded as Starlette decodes it (a bad percent-escape becomes U+FFFD, never a surrogate).
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        for text in (name, value):
            if reason := text_problem(text):
                return name, reason
    return None


def _path_fault(scope: Scope) -> tuple[str, str] | None:
    reason = text_problem(scope["path"])
    if reason is None:
        return None
    return _path_param(scope) or "path", reason


def _path_param(scope: Scope) -> str | None:
    """The path parameter holding the bad text, by the published path templates the path fits
    (``/v1/admin/teams/{team}``); None for a path no template fits."""
    app = scope.get("app")
    if app is None or not hasattr(app, "openapi"):
        return None
    for template in app.openapi().get("paths", {}):
        names = re.findall(r"{(\w+)}", template)
        pattern = re.sub(r"\\{\w+\\}", "([^/]*)", re.escape(template))
        if names and (found := re.fullmatch(pattern, scope["path"], re.DOTALL)):
            return next((name for name, value in zip(names, found.groups(), strict=True)
                         if text_problem(value)), None)
    return None


def _is_json(scope: Scope) -> bool:
    """A body FastAPI would parse as JSON: a JSON media type, or none declared."""
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True


class InputGuard:
    """422 ``invalid_request`` naming the field for text no column can hold in the path, the
    query string or a JSON body, and for JSON nested or numbered past what Python parses.
    Inside :class:`~api.http.error_responses.BodySizeLimit`, so a body is already bounded;
    ``streamed`` routes (uploads) keep their body to themselves."""

    def __init__(self, app: ASGIApp, streamed: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.app = app
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fault = _path_fault(scope) or _query_fault(scope.get("query_string", b""))
        if fault is None and (scope["method"], scope["path"]) not in self.streamed and _is_json(scope):
            body = b"".join([chunk async for chunk in _body(receive)])
            if _worth_parsing(body):
                fault = await run_in_threadpool(json_fault, body)
            receive = replay_body(body, receive)
        if fault is None:
            await self.app(scope, receive, send)
            return
        param, reason = fault
        await error_response(422, "invalid_request", f"{param}: {reason}", param)(scope, receive, send)


def _worth_parsing(body: bytes) -> bool:
    return body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH or _SUSPECT.search(body) is not None


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    more = True
    while more:
        message: Message = await receive()
        if message["type"] != "http.request":
            return
        yield message.get("body", b"")
        more = message.get("more_body", False)
