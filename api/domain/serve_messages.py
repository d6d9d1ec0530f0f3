"""What the API and a serving job say to each other over Redis about one chat request: plain JSON
both sides read (:mod:`api.http.serve_relay` writes requests and reads events, :mod:`worker.serving`
the other way round).

A request (:class:`RelayedRequest`) goes onto the serving job's list (``RedisKeys.serve_requests``):
its id, the generation body in OpenAI's field names (checked by the API with
:func:`grpo_core.serving.requests.parse_request` first, and again by the worker), the key the
events go to (``RedisKeys.serve_reply``), the key that says its client went away
(``RedisKeys.serve_cancel``) and its deadline: a serving job that pops it later drops it unanswered
(the API has answered 503 by then). Its events, in order: :class:`Started` once the serving job
took it, any number of :class:`Delta`, then one final :class:`Done` or :class:`Failed`; a request
refused before it started gets only :class:`Failed`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# The fields of an OpenAI chat or completions body that reach the model (the rest is the API's).
GENERATION_FIELDS = ("messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                     "stop", "seed")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RelayedRequest(_Message):
    id: str = Field(..., min_length=1, max_length=64)
    body: dict[str, Any] = Field(description="The generation's fields, as OpenAI names them "
                                 "(GENERATION_FIELDS); max_tokens always set")
    reply: str
    cancel: str
    deadline: float = Field(description="Epoch seconds: not started by then, it is dropped unanswered")

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.deadline


class Started(_Message):
    """The serving job took the request: its tokens come next."""

    type: Literal["started"] = "started"


class Delta(_Message):
    type: Literal["delta"] = "delta"
    text: str


class Done(_Message):
    type: Literal["done"] = "done"
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class Failed(_Message):
    """The request was not (or not wholly) served: ``status`` and ``code`` as the API answers them
    (``422 invalid_request`` naming ``param`` for a request this model cannot take; ``503
    unavailable`` when the serving job stopped under it: retry)."""

    type: Literal["error"] = "error"
    status: int
    code: str
    message: str
    param: str | None = None


ReplyEvent = Annotated[Started | Delta | Done | Failed, Field(discriminator="type")]
_EVENT = TypeAdapter(ReplyEvent)


def generation_body(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The fields of ``body`` that reach the model, ``max_tokens`` resolved (the API's default or
    limit applied), so that both sides read one request."""
    kept = {name: body[name] for name in GENERATION_FIELDS if body.get(name) is not None}
    kept.pop("max_completion_tokens", None)
    return {**kept, "max_tokens": max_tokens}


def request_message(request: RelayedRequest) -> str:
    return request.model_dump_json()


def read_request(raw: bytes | str) -> RelayedRequest:
    """ValueError for a message that is not a relayed request."""
    try:
        return RelayedRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise ValueError(f"not a chat request: {exc.errors()[0]['msg']}") from None


def event_message(event: Started | Delta | Done | Failed) -> str:
    return event.model_dump_json()


def read_event(raw: bytes | str) -> Started | Delta | Done | Failed:
    """ValueError for a message that is not a reply event."""
    try:
        return _EVENT.validate_json(raw)
    except ValidationError as exc:
        raise ValueError(f"not a chat reply event: {exc.errors()[0]['msg']}") from None
