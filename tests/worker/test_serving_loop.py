"""A serving job's loop (``worker.serving.ServeLoop``) on the tiny model and a real Redis, without
the rest of the stack: requests popped from the job's list and answered on their reply keys
(started, deltas, done), a bad one refused naming its field, an expired one dropped, one whose
client left cancelled; a stop answers every request in flight or queued 503 and ends as asked;
an idle loop ends succeeded."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from api.domain.lifecycle import JobStatus, StopRequest
from api.domain.serve_messages import (
    Delta,
    Done,
    Failed,
    RelayedRequest,
    Started,
    read_event,
    request_message,
)
from api.domain.serve_spec import ServeConfig, ServeSpec
from api.schemas.jobs import JobRead
from api.settings import Settings
from worker.attempt_files import AttemptFiles
from worker.serving import ServeLoop

JOB_ID = 41


@pytest.fixture(scope="module")
def engine_parts(tiny_model_dir: Path):
    import torch

    from grpo_core.io.model_loading import load_causal_lm, load_tokenizer
    from grpo_core.run.components import eos_token_ids

    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_causal_lm(str(tiny_model_dir), "float32", torch.device("cpu"))
    return model, tokenizer, eos_token_ids(tokenizer, model)


@pytest.fixture
def settings() -> Settings:
    return Settings(redis_url=os.environ["GRPO_TEST_REDIS_URL"], namespace=f"serve-{uuid.uuid4().hex[:8]}",
                    serve_wait_seconds=30)


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(settings.redis_url) as connection:
        yield connection
        stale = list(connection.scan_iter(match=settings.redis_keys.everything_pattern))
        if stale:
            connection.delete(*stale)


def _loop(settings: Settings, client: redis.Redis, engine_parts, tmp_path: Path, idle_seconds: int = 30,
          max_batch: int = 2) -> ServeLoop:
    from grpo_core.serving.engine import ServingEngine

    model, tokenizer, eos = engine_parts
    spec = ServeSpec(name="serve-job-1", serve=ServeConfig(model="job:1", idle_seconds=idle_seconds,
                                                           max_batch=max_batch))
    engine = ServingEngine(model, tokenizer, "cpu", max_batch, eos_token_ids=eos)
    job = JobRead.model_construct(id=JOB_ID)
    return ServeLoop(job, spec, settings, AttemptFiles(tmp_path), client, engine)


def _push(settings: Settings, client: redis.Redis, body: dict[str, Any], deadline_in: float = 30.0
          ) -> RelayedRequest:
    keys, request_id = settings.redis_keys, uuid.uuid4().hex
    request = RelayedRequest(id=request_id, body={"max_tokens": 8, **body},
                             reply=keys.serve_reply(request_id), cancel=keys.serve_cancel(request_id),
                             deadline=time.time() + deadline_in)
    client.rpush(keys.serve_requests(JOB_ID), request_message(request))
    return request


def _events(client: redis.Redis, request: RelayedRequest, timeout: float = 30.0) -> list[Any]:
    """Every event of ``request`` up to its final one."""
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while not found or isinstance(found[-1], Started | Delta):
        assert time.monotonic() < deadline, f"no final event; so far {found}"
        popped = client.blpop([request.reply], timeout=1)
        if popped is not None:
            found.append(read_event(popped[1]))
    return found


def _running(loop: ServeLoop) -> tuple[threading.Thread, list[Any]]:
    ended: list[Any] = []
    thread = threading.Thread(target=lambda: ended.append(loop.run()), daemon=True)
    thread.start()
    return thread, ended


def test_requests_are_answered_refused_or_dropped_and_an_idle_loop_ends(settings, client, engine_parts,
                                                                        tmp_path) -> None:
    loop = _loop(settings, client, engine_parts, tmp_path, idle_seconds=2)
    chat = _push(settings, client, {"messages": [{"role": "user", "content": "What is 2+3?"}], "seed": 1})
    plain = _push(settings, client, {"prompt": "hello", "temperature": 0})
    bad = _push(settings, client, {"messages": [{"role": "tool", "content": "x"}]})
    too_long = _push(settings, client, {"prompt": "hello world " * 1100})  # past the model's 1024 positions
    expired = _push(settings, client, {"prompt": "late"}, deadline_in=-1)
    thread, ended = _running(loop)

    for request in (chat, plain):
        events = _events(client, request)
        assert isinstance(events[0], Started) and isinstance(events[-1], Done), events
        done = events[-1]
        assert done.prompt_tokens > 0 and 0 < done.completion_tokens <= 8
        assert done.finish_reason in ("stop", "length")
    [refusal] = _events(client, bad)
    assert (refusal.status, refusal.code, refusal.param) == (422, "invalid_request", "messages.0.role")
    [refusal] = _events(client, too_long)  # refused by the engine, before any "started"
    assert (refusal.status, refusal.param) == (422, "prompt") and "positions" in refusal.message
    thread.join(30)
    assert not thread.is_alive() and ended[0].status is JobStatus.SUCCEEDED
    assert client.llen(expired.reply) == 0  # nobody waits for it: no answer at all
    assert loop.served == 2 and loop.prompt_tokens > 0
    assert AttemptFiles(tmp_path).progress() is not None  # alive for the supervisor's stall watch


def test_a_client_that_left_is_dropped_from_the_batch(settings, client, engine_parts, tmp_path) -> None:
    loop = _loop(settings, client, engine_parts, tmp_path, idle_seconds=2)
    long = _push(settings, client, {"messages": [{"role": "user", "content": "count 1"}], "temperature": 0,
                                    "max_tokens": 900})
    thread, ended = _running(loop)
    assert isinstance(read_event(client.blpop([long.reply], timeout=30)[1]), Started)
    client.set(long.cancel, b"1")
    thread.join(30)
    assert ended[0].status is JobStatus.SUCCEEDED
    events = [read_event(raw) for raw in client.lrange(long.reply, 0, -1)]
    assert all(isinstance(event, Delta) for event in events)  # no final event: its client is gone
    assert loop.served == 0


def test_a_stop_answers_every_request_503_and_ends_as_asked(settings, client, engine_parts, tmp_path) -> None:
    loop = _loop(settings, client, engine_parts, tmp_path, max_batch=1)
    asked = [_push(settings, client, {"messages": [{"role": "user", "content": f"count {n}"}],
                                      "temperature": 0, "max_tokens": 900}) for n in (1, 2)]
    thread, ended = _running(loop)
    assert isinstance(read_event(client.blpop([asked[0].reply], timeout=30)[1]), Started)
    AttemptFiles(tmp_path).request_stop(StopRequest.PREEMPT)
    thread.join(30)
    assert ended[0].status is JobStatus.PREEMPTED
    in_flight, queued = _events(client, asked[0])[-1], _events(client, asked[1])[-1]
    for failed in (in_flight, queued):
        assert isinstance(failed, Failed) and (failed.status, failed.code) == (503, "unavailable")
    assert "preempted" in in_flight.message and "before it took" in queued.message
    assert client.llen(settings.redis_keys.serve_requests(JOB_ID)) == 0


def test_a_lora_adapter_is_served_folded_into_its_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    from grpo_core.io.model_loading import load_causal_lm, load_tokenizer
    from worker.serving import is_adapter, load_model

    base = load_causal_lm(str(tiny_model_dir), "float32", torch.device("cpu"))
    adapted = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                              init_lora_weights=False))
    adapter = tmp_path / "step-2"
    adapted.save_pretrained(adapter)
    load_tokenizer(str(tiny_model_dir)).save_pretrained(adapter)
    assert is_adapter(adapter) and not is_adapter(tiny_model_dir)

    asked: list[str] = []
    cpu = torch.device("cpu")
    served = load_model(adapter, "float32", cpu, lambda: asked.append("base") or str(tiny_model_dir))
    assert asked == ["base"] and not hasattr(served, "peft_config")  # merged: a plain model
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        expected = adapted(input_ids=ids).logits
        assert torch.allclose(served(input_ids=ids).logits, expected, atol=1e-5)
    assert load_model(tiny_model_dir, "float32", cpu, lambda: pytest.fail("no base")) is not None
