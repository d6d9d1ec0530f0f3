"""The job stream in the OpenAPI description: FastAPI leaves WebSocket routes out (OpenAPI
describes HTTP operations only), so clients reading ``/docs`` or generating code would never
learn of it. It is added as the ``GET`` that opens it (the HTTP upgrade), with its parameters,
its handshake answers, and, under ``x-websocket``, its messages and close codes; the message
schemas are added to the components so they render like every other schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.http.routes import stream
from api.schemas.stream import CLOSE_CODES, STREAM_MESSAGES

STREAM_PATH = "/v1/jobs/{job_id}/stream"
_REF = "#/components/schemas/{model}"


def _stream_operation() -> dict[str, Any]:
    messages = [{"$ref": _REF.format(model=model.__name__)} for model in STREAM_MESSAGES]
    return {
        "tags": ["stream"],
        "summary": "Follow a job live (WebSocket)",
        "operationId": "stream_job",
        "description": stream.__doc__,
        "parameters": [
            {"name": "job_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}},
            {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0},
             "description": "Only steps after this one (a reconnect sends the last step it saw)"},
            {"name": "after_event", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0},
             "description": "Only events after this id"},
            {"name": "ticket", "in": "query", "schema": {"type": "string"},
             "description": "A single-use ticket from POST /v1/stream-tickets (browsers)"},
            {"name": "Sec-WebSocket-Protocol", "in": "header", "schema": {"type": "string"},
             "description": "grpo.v1, grpo.ticket.<ticket> or grpo.bearer.<key> (browsers)"},
        ],
        "responses": {
            "101": {"description": "Switching protocols: the stream is open; JSON text frames follow",
                    "content": {"application/json": {"schema": {"oneOf": messages}}}},
            "401": {"description": "Missing or wrong credential"},
            "404": {"description": "No such job"},
            "422": {"description": "A bad parameter"},
            "503": {"description": "Redis or the database is unavailable; retry"},
        },
        "x-websocket": {"messages": messages,
                        "close_codes": {str(code): meaning for code, meaning in CLOSE_CODES.items()}},
    }


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the stream (built once, as FastAPI's own is)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in STREAM_MESSAGES:
                definition = model.model_json_schema(ref_template=_REF, mode="serialization")
                for name, nested in definition.pop("$defs", {}).items():
                    components.setdefault(name, nested)  # JobRead & co. as the REST routes show them
                components[model.__name__] = definition
            schema["paths"][STREAM_PATH] = {"get": _stream_operation()}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
