"""Every error leaves the API as ``{"error": {"code", "message", "param"}}`` (plus ``errors``,
one ``{"param", "message"}`` per invalid field, when validation found several).

Domain errors (:class:`api.domain.errors.ServiceError`) know nothing of HTTP; the one table below maps
their ``code`` to a status. The body-size guard lives here too because it answers with the same
shape, before anything has parsed the request.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError, WebSocketRequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.domain.errors import RateLimited, ServiceError, Unavailable
from api.outages import OUTAGES, backend_down
from api.storage import StorageUnavailable
from grpo_core.errors import SpecError
from grpo_core.spec.spec_file import InvalidSpec, field_path

STATUS_BY_CODE = {
    "invalid_input": 422,
    "invalid_spec": 422,
    "invalid_request": 422,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "queue_full": 409,
    "budget_exhausted": 422,  # names the budget to raise: team.gpu_hours_budget or resources.max_gpu_hours
    "upload_too_slow": 408,
    "request_too_large": 413,
    "artifact_quota_exceeded": 413,  # this upload is larger than the room left in the team's quota
    "rate_limited": 429,
    # nginx's status for a client that went away: nobody reads it, but the access log shows why.
    "client_closed_request": 499,
    "not_ready": 503,
    "unavailable": 503,
    # Not 507: that WebDAV status reads as this request's failing for good, and clients do not
    # retry it; a full spool disk frees itself as the uploads in flight end.
    "spool_full": 503,
}
# A backend outage is the service's, not the request's: a 503 the client may retry after this
# many seconds (a database restart or a Redis failover takes a few), never a 500.
RETRY_AFTER_SECONDS = 5
_CODE_BY_STATUS = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "request_too_large"}


def error_body(code: str, message: str, param: str | None = None,
               errors: list[dict[str, str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message, "param": param}
    if errors is not None and len(errors) > 1:
        body["errors"] = errors
    return {"error": body}


def error_response(status: int, code: str, message: str, param: str | None = None,
                   errors: list[dict[str, str]] | None = None) -> JSONResponse:
    # A 401 names the scheme it wants (RFC 6750), so clients know to send a bearer token.
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(code, message, param, errors), status_code=status, headers=headers)


def _field_errors(code: str, errors: list[tuple[str, str]]) -> JSONResponse:
    """422 naming the first invalid field as ``param`` and listing all of them, in ``errors`` and
    in the message too: a client that shows only the message hides none of them."""
    listed = [{"param": p, "message": m} for p, m in errors]
    message = "; ".join(f"{p}: {m}" for p, m in errors)
    return error_response(422, code, message, errors[0][0], listed)


async def _service_error(_conn: HTTPConnection, exc: ServiceError) -> JSONResponse:
    return error_response(STATUS_BY_CODE.get(exc.code, 400), exc.code, exc.message, exc.param)


async def _retry_later(_conn: HTTPConnection, exc: RateLimited | Unavailable) -> JSONResponse:
    response = error_response(STATUS_BY_CODE[exc.code], exc.code, exc.message, exc.param)
    response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return response


async def _invalid_spec(_conn: HTTPConnection, exc: InvalidSpec) -> JSONResponse:
    return _field_errors("invalid_spec", [(e.field, e.reason) for e in exc.errors])


async def _spec_error(_conn: HTTPConnection, exc: SpecError) -> JSONResponse:
    return _field_errors("invalid_spec", [(exc.field, exc.reason)])


async def _validation_error(_conn: HTTPConnection, exc: Exception) -> JSONResponse:
    """Pydantic's errors, located without FastAPI's ``body``/``query`` prefix. (A JobSpec body is
    parsed by its route, :mod:`api.http.spec_intake`, and its errors are ``invalid_spec``.)"""
    found = list(exc.errors())  # type: ignore[attr-defined]
    return _field_errors("invalid_request", [(_param(err), err["msg"]) for err in found])


def _param(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    if len(loc) < 2 or err.get("type") == "json_invalid":  # a JSON syntax error's loc is a position
        return str(loc[0]) if loc else "body"
    # A body path reads like the spec (rewards.0.name); a parameter is named by itself, a header
    # as it is usually written (Idempotency-Key).
    if loc[0] == "body":
        return field_path(loc[1:])
    return str(loc[1]).title() if loc[0] == "header" else str(loc[1])


async def _backend_unavailable(_conn: HTTPConnection, exc: Exception) -> JSONResponse:
    """The database, Redis or the object store did not answer (connection refused or dropped,
    pool exhausted): 503 ``unavailable`` with ``Retry-After``; the response is an ordinary one,
    so the client's connection stays open. On a WebSocket not yet accepted it is the handshake's answer."""
    backend = "the object store" if isinstance(exc, StorageUnavailable) else backend_down(exc)
    response = error_response(503, "unavailable", f"{backend} is unavailable; retry in a few seconds")
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


async def _http_error(_conn: HTTPConnection, exc: StarletteHTTPException) -> JSONResponse:
    code = _CODE_BY_STATUS.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


def install_error_handlers(app: FastAPI) -> None:
    """On a WebSocket not yet accepted, Starlette sends the returned response as the handshake's
    HTTP answer (the denial-response extension), so a client sees the same 401/404/422."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RateLimited, _retry_later)
    app.add_exception_handler(Unavailable, _retry_later)
    app.add_exception_handler(InvalidSpec, _invalid_spec)
    app.add_exception_handler(SpecError, _spec_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(WebSocketRequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for outage in (*OUTAGES, StorageUnavailable):
        app.add_exception_handler(outage, _backend_unavailable)


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413 before anything parses them: at once by
    a declared ``Content-Length``, else by counting a chunked body as it streams in. The accepted
    body (at most ``max_bytes``) is buffered and replayed to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 streamed: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # (method, path) of the routes that stream their body and bound it themselves (uploads).
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) in self.streamed:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body; there is no one to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            more = message.get("more_body", False)
        # Its size, however it came (declared or chunked), is what a rate limit charges for it.
        scope.setdefault("state", {})["body_bytes"] = size
        await self.app(scope, replay_body(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, "request_too_large",
                                  f"request body is larger than {self.max_bytes} bytes", "body")
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def replay_body(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # only a disconnect can come after the body
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
