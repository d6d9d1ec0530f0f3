"""``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's endpoints, answered from a
job's model (``model``: a job's ``fine_tuned_model``, ``job:ID``, or a checkpoint, ``job:ID@STEP``)
by the team's serving job of it (:mod:`api.http.serve_relay`), plain or streamed as server-sent
events (``data: {chunk}`` lines, then ``data: [DONE]``), so OpenAI's clients work unchanged.

Thin: the body is checked here (its shape by its schema, :mod:`api.schemas.chat`; a field this
service does not implement, and the generation's own rules,
:func:`grpo_core.serving.requests.parse_request`, each a 422 naming the field), then relayed. A
serving job that waits for a device past ``GRPO_SERVE_WAIT_SECONDS``, or stops under the request
(a preemption), is a 503 with Retry-After; in a stream, whose 200 went out already, an error event
(``data: {"error": {...}}``, which OpenAI's clients raise).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.domain.errors import InvalidInput, ServiceError
from api.domain.serve_messages import Delta, Done, generation_body
from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.http.error_responses import STATUS_BY_CODE
from api.http.serve_relay import ChatRelay, serving_job_for
from api.schemas.chat import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Usage,
    unsupported_field,
)
from api.settings import Settings
from grpo_core.serving.requests import parse_request

router = APIRouter(tags=["chat"])

_STREAM = {"text/event-stream": {"schema": {"type": "string"}, "description": "With `stream: true`: "
                                 "`data: {chunk}` lines, then `data: [DONE]`"}}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "`model` names no job of your team"},
    409: {"description": "The job has no such model yet (no final model or checkpoint, or no checkpoint "
                         "of that step); or `queue_full`: the team's queue is full for a new serving job"},
    422: {"description": "A bad field, or one this service does not implement (`n` > 1, `tools`, "
                         "`logprobs`...); `param` names it"},
    503: {"description": "The serving job did not take the request within `GRPO_SERVE_WAIT_SECONDS`, or "
                         "stopped under it (a preemption): retry after `Retry-After` seconds"},
}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={**_RESPONSES, 200: {"content": _STREAM, "description": "The completion"}})
async def chat_completions(body: ChatCompletionRequest, request: Request, principal: PrincipalDep,
                           settings: SettingsDep, redis: RedisDep) -> Any:
    """An answer to a conversation from a job's model (OpenAI's ``chat.completion``), or with
    ``stream: true`` its ``chat.completion.chunk`` events. Served by the team's serving job of the
    model, started for the first request (a job of ``kind: serve`` in `/v1/jobs`, charged to the
    team like any job), which ends once idle for the team's ``serve_idle_seconds``."""
    fields = body.model_dump(exclude_none=True)
    fields["messages"] = [{"role": message.role, "content": message.text()} for message in body.messages]
    generation = _generation(body, fields, settings, sum(len(m["content"]) for m in fields["messages"]),
                             "messages")
    relay = await _started(request, principal, settings, redis, body.model, generation)
    answer_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    fingerprint = f"job-{relay.job.id}"
    if body.stream:
        usage_chunk = body.stream_options is not None and body.stream_options.include_usage

        def chunk(delta: ChunkDelta, finish: str | None = None, usage: Usage | None = None,
                  choices: bool = True) -> str:
            listed = [ChatChunkChoice(index=0, delta=delta, finish_reason=finish)] if choices else []
            return ChatCompletionChunk(id=answer_id, created=created, model=body.model, choices=listed,
                                       usage=usage, system_fingerprint=fingerprint).model_dump_json()

        stream = _sse(relay, first=chunk(ChunkDelta(role="assistant", content="")),
                      delta=lambda text: chunk(ChunkDelta(content=text)),
                      last=lambda done: chunk(ChunkDelta(), done.finish_reason),
                      usage=(lambda done: chunk(ChunkDelta(), usage=_usage(done), choices=False))
                      if usage_chunk else None)
        return StreamingResponse(stream, media_type="text/event-stream", headers=_SSE_HEADERS)
    text, done = await _answer(relay, request)
    return ChatCompletion(id=answer_id, created=created, model=body.model, usage=_usage(done),
                          choices=[ChatChoice(index=0, message=AssistantMessage(content=text),
                                              finish_reason=done.finish_reason)],
                          system_fingerprint=fingerprint)


@router.post("/completions", response_model=Completion,
             responses={**_RESPONSES, 200: {"content": _STREAM, "description": "The completion"}})
async def completions(body: CompletionRequest, request: Request, principal: PrincipalDep,
                      settings: SettingsDep, redis: RedisDep) -> Any:
    """A prompt continued by a job's model, as it is (no chat template): OpenAI's legacy
    ``text_completion``, or with ``stream: true`` its chunks. Served as chat completions are."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidInput("prompt: one prompt per request (send several requests for several)",
                               param="prompt")
        prompt = prompt[0]
    fields = {**body.model_dump(exclude_none=True), "prompt": prompt}
    generation = _generation(body, fields, settings, len(prompt), "prompt")
    relay = await _started(request, principal, settings, redis, body.model, generation)
    answer_id, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    fingerprint = f"job-{relay.job.id}"
    if body.stream:
        usage_chunk = body.stream_options is not None and body.stream_options.include_usage

        def chunk(text: str, finish: str | None = None, usage: Usage | None = None,
                  choices: bool = True) -> str:
            listed = [CompletionChoice(index=0, text=text, finish_reason=finish)] if choices else []
            return Completion(id=answer_id, created=created, model=body.model, choices=listed, usage=usage,
                              system_fingerprint=fingerprint).model_dump_json()

        totals = (lambda done: chunk("", usage=_usage(done), choices=False)) if usage_chunk else None
        stream = _sse(relay, first=None, delta=chunk, last=lambda done: chunk("", done.finish_reason),
                      usage=totals)
        return StreamingResponse(stream, media_type="text/event-stream", headers=_SSE_HEADERS)
    text, done = await _answer(relay, request)
    return Completion(id=answer_id, created=created, model=body.model, usage=_usage(done),
                      choices=[CompletionChoice(index=0, text=text, finish_reason=done.finish_reason)],
                      system_fingerprint=fingerprint)


def _generation(body: ChatCompletionRequest | CompletionRequest, fields: dict[str, Any], settings: Settings,
                chars: int, text_field: str) -> dict[str, Any]:
    """The generation's fields as the serving job reads them, checked here first: a field this
    service does not implement, text over ``GRPO_SERVE_MAX_INPUT_CHARS``, and the generation's own
    rules (the serving job checks them again), each a 422 naming the field."""
    unsupported = unsupported_field(body)
    if unsupported == "n":
        raise InvalidInput("n: one choice per request on this service; send n requests", param="n")
    if unsupported is not None:
        raise InvalidInput(f"{unsupported}: not supported by this service, which generates plain text "
                           "(no tools, logprobs, penalties or response formats)", param=unsupported)
    if chars > settings.serve_max_input_chars:
        raise InvalidInput(f"{text_field}: {chars} characters, more than the "
                           f"{settings.serve_max_input_chars} this service takes in a request",
                           param=text_field)
    limit = settings.serve_max_tokens
    try:
        parsed = parse_request(fields, default_max_tokens=limit, max_tokens_limit=limit)
    except ValueError as exc:
        name = str(exc).partition(":")[0].strip()
        raise InvalidInput(str(exc), param=name.replace("[", ".").replace("]", "") or None) from None
    return generation_body(fields, parsed.params.max_tokens)


async def _started(request: Request, principal: PrincipalDep, settings: Settings, redis: RedisDep, model: str,
                   generation: dict[str, Any]) -> ChatRelay:
    """The request pushed to its serving job (found or queued) and taken by it."""
    state = request.app.state
    job = await run_in_threadpool(serving_job_for, settings, state, principal, model)
    relay = ChatRelay(redis, settings, state, principal, model, generation, job)
    await relay.start(request.is_disconnected)
    return relay


async def _answer(relay: ChatRelay, request: Request) -> tuple[str, Done]:
    parts, done = [], None
    async for event in relay.events(request.is_disconnected):
        if isinstance(event, Delta):
            parts.append(event.text)
        elif isinstance(event, Done):
            done = event
    assert done is not None  # events() ends with Done or raises
    return "".join(parts), done


def _usage(done: Done) -> Usage:
    return Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                 total_tokens=done.prompt_tokens + done.completion_tokens)


async def _sse(relay: ChatRelay, *, first: str | None, delta: Callable[[str], str],
               last: Callable[[Done], str], usage: Callable[[Done], str] | None) -> AsyncIterator[str]:
    """The events as server-sent events. A comment while the model is silent, so a client that
    left is noticed; the request is withdrawn however the stream ends early."""
    try:
        if first is not None:
            yield f"data: {first}\n\n"
        async for event in relay.events(quiet=True):
            if event is None:
                yield ": waiting\n\n"
            elif isinstance(event, Delta):
                yield f"data: {delta(event.text)}\n\n"
            else:
                yield f"data: {last(event)}\n\n"
                if usage is not None:
                    yield f"data: {usage(event)}\n\n"
        yield "data: [DONE]\n\n"
    except ServiceError as exc:  # the 200 went out: an error event, which OpenAI's clients raise
        status = STATUS_BY_CODE.get(exc.code, 503)
        error = {"code": exc.code, "message": exc.message, "param": exc.param, "status": status,
                 "type": "server_error" if status >= 500 else "invalid_request_error"}
        yield f"data: {json.dumps({'error': error})}\n\n"
    finally:
        if not relay.done:
            await relay.abandon_shielded()

