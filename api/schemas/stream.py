"""The WebSocket stream's messages (``/v1/jobs/{id}/stream``), as schemas for the API's
OpenAPI description: a WebSocket is no HTTP operation, so OpenAPI has no place for its frames
and FastAPI leaves it out; :mod:`api.http.openapi_stream` documents it with these."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas.jobs import EventRead, JobRead


class MetricsMessage(BaseModel):
    type: Literal["metrics"]
    step: int = Field(description="The optimizer step (from 1), each sent once per connection, in order")
    values: dict[str, Any] = Field(description="The step's metrics, the names of GET .../metrics")


class EventMessage(BaseModel):
    type: Literal["event"]
    event: EventRead


class SamplesMessage(BaseModel):
    type: Literal["samples"]
    step: int
    rows: list[dict[str, Any]] = Field(description="Sample completions with their rewards and advantages")


class StatusMessage(BaseModel):
    type: Literal["status"]
    status: str = Field(description="On connect and on every change; the last message once the job has ended")
    job: JobRead


STREAM_MESSAGES = (MetricsMessage, EventMessage, SamplesMessage, StatusMessage)

CLOSE_CODES = {
    1000: "the job finished (its last message was its final status)",
    1008: "the connection broke the stream's rules",
    1011: "the server failed; reconnect",
    1013: "try again later: the client read too slowly (256 messages queued), or Redis or the "
          "database went away; reconnect with after=<last step seen>",
    4401: "the key was revoked while the stream was open",
}
