"""A serving job's attempt (:mod:`api.domain.serve_spec`), in the job's process: load the model its
spec names, answer the chat requests the API pushes onto the job's list until none came for
``serve.idle_seconds``, then end ``succeeded``, the model unloaded and the device freed.

The model is a ``job:ID[@STEP]`` source, resolved as a training job's is
(:func:`worker.job_sources.job_model_folder`: the other job's final model or a checkpoint an
attempt published, fetched from the object store where that is apart), and loaded with its
tokenizer on the job's device (CUDA when the job has one, else the CPU); a LoRA adapter is folded
into the trained job's base model (:func:`load_model`). Requests are generated
together on the one loaded model by :class:`grpo_core.serving.engine.ServingEngine` (continuous
batching, at most ``serve.max_batch`` at once); the loop here, one thread, pops requests
(:mod:`api.domain.serve_messages`) while the batch has room, steps the engine, and pushes each
request's events to its reply key as they come. A request whose client went away (its cancel key)
is cancelled in the engine.

Stop requests arrive as a training job's do (:meth:`worker.attempt_files.AttemptFiles.stop_reason`),
checked at every turn: the requests in the batch and those still waiting in the job's list are
answered ``503 unavailable`` (their clients retry, and a new or resumed serving job takes them),
and the attempt ends as the stop asks (cancelled, paused, preempted). The loop marks its progress
for the supervisor's stall watch every second it turns (:meth:`AttemptFiles.mark_progress`): a
stuck generation stops the marks and is killed as ``stalled``, an idle job is not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from api.domain.errors import NotFound
from api.domain.lifecycle import JobStatus, StopRequest
from api.domain.serve_messages import (
    Delta,
    Done,
    Failed,
    RelayedRequest,
    Started,
    event_message,
    read_request,
)
from api.domain.serve_spec import ServeSpec, served_job
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus
from api.store.db import session_scope
from grpo_core.errors import GRPOError, SourceUnavailable, SpecError
from grpo_core.oom import out_of_memory_error
from worker.attempt_files import AttemptFiles
from worker.fencing import AttemptFence
from worker.outcome import Fault, Outcome, outcome_for_stop
from worker.reporting import JobReporter

log = logging.getLogger(__name__)

SERVING_UNAVAILABLE = "serving_unavailable"  # a Fault's code: Redis away, the requests cannot flow
# A chat request's answers as the API gives them (api.http.error_responses), not a job's codes.
UNAVAILABLE, INVALID_REQUEST = "unavailable", "invalid_request"
# How often the loop reads its requests' cancel keys while it generates, and marks its progress.
CANCEL_CHECK_SECONDS = 0.2
MARK_SECONDS = 1.0
_STOPPED = {StopRequest.CANCEL: "cancelled", StopRequest.PAUSE: "paused",
            StopRequest.PREEMPT: "preempted by a higher-priority job"}


def serve_attempt(job: JobRead, settings: Settings, files: AttemptFiles) -> Outcome | Fault:
    """Serve until idle or stopped. Failures of the job's own raise (the caller,
    :func:`worker.attempt.run_attempt`, turns them into the attempt's outcome); Redis away is a Fault."""
    import torch

    from grpo_core.io.model_loading import load_tokenizer
    from grpo_core.parallel.placement import pick_device
    from grpo_core.run.components import eos_token_ids
    from grpo_core.serving.engine import ServingEngine
    from worker.job_sources import job_model_folder

    spec = ServeSpec.model_validate(job.spec)
    client = bus.connect(settings)
    try:
        publish = bus.publisher(client, settings.redis_keys, settings.stream_maxlen)
        fence = AttemptFence(settings, job.id, job.worker_id or "", job.attempt)
        reporter = JobReporter(settings.database_url, job.id, publish, job.attempt, settings.db_retry_seconds,
                               fence=fence)
        files.mark_progress(0, 0)
        try:
            folder = job_model_folder(settings, "serve.model", spec.serve.model)
            device = pick_device()
            dtype = "float32" if device.type != "cuda" else (
                "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
            tokenizer = load_tokenizer(str(folder), "serve.model")
            model = load_model(folder, dtype, device, lambda: served_base(settings, spec.serve.model))
            engine = ServingEngine(model, tokenizer, device, spec.serve.max_batch,
                                   eos_token_ids=eos_token_ids(tokenizer, model))
        except Exception as exc:  # the requests waiting for it hear why, then the attempt ends
            why = exc.message if isinstance(exc, GRPOError) else f"{type(exc).__name__}: {exc}"
            message = f"the serving job could not load {spec.serve.model}: {why}"
            answer_waiting(client, settings, job.id, Failed(status=503, code=UNAVAILABLE, message=message))
            raise
        reporter.on_event("serving", f"serving {spec.serve.model} on {device.type}; it unloads after "
                          f"{spec.serve.idle_seconds} s without a request",
                          {"model": spec.serve.model, "device": str(device), "dtype": dtype,
                           "max_batch": spec.serve.max_batch, "idle_seconds": spec.serve.idle_seconds})
        loop = ServeLoop(job, spec, settings, files, client, engine)
        try:
            outcome = loop.run()
        except RedisError as exc:
            loop.answer_all_unavailable("the serving job lost its queue")
            return Fault(f"Redis failed while serving: {exc}", {"error_code": SERVING_UNAVAILABLE},
                         SERVING_UNAVAILABLE)
        except Exception as exc:
            loop.answer_all_unavailable("the serving job failed")
            known = out_of_memory_error(exc)
            if known is not None:
                raise known from exc
            raise
        reporter.on_event("served", f"served {loop.served} request(s); {outcome.message}",
                          {"requests": loop.served, "prompt_tokens": loop.prompt_tokens,
                           "completion_tokens": loop.completion_tokens})
        return outcome
    finally:
        client.close()


# A model folder with any of these holds whole weights; one with only an adapter_config.json is a LoRA
# adapter (a LoRA job's checkpoint, or its final model unless exported merged).
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
            "pytorch_model.bin.index.json")


def is_adapter(folder: Path) -> bool:
    weights = any((folder / name).is_file() for name in _WEIGHTS)
    return (folder / "adapter_config.json").is_file() and not weights


def load_model(folder: Path, dtype: str, device: Any, base: Callable[[], str]):
    """The served model, for generation: the folder's weights, or a LoRA adapter folded into its
    base (``base()``: the base's location, read only for an adapter), as a job's merged export is."""
    from grpo_core.io.model_loading import load_causal_lm

    if not is_adapter(folder):
        return load_causal_lm(str(folder), dtype, device)
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise SpecError("serve.model", "a LoRA adapter is served on its base model, which needs the "
                                       "'peft' package on the worker") from exc
    model = load_causal_lm(base(), dtype, device)
    return PeftModel.from_pretrained(model, str(folder)).merge_and_unload()


def served_base(settings: Settings, model: str) -> str:
    """Where the base of the LoRA job that ``model`` (``job:ID[@STEP]``) names loads from: its spec's
    ``model.source``, a ``path:`` or ``hf:`` source, or another job's whole model."""
    from api.domain.job_spec import continued_job
    from api.store.jobs import get_job
    from grpo_core.io.model_loading import resolve_source_location
    from worker.job_sources import job_model_folder

    job_id, _ = served_job(model)
    try:
        with session_scope(settings.database_url) as session:
            source = (get_job(session, job_id).spec.get("model") or {}).get("source")
    except NotFound:
        raise SourceUnavailable("serve.model", f"job {job_id} no longer exists") from None
    if not isinstance(source, str):
        raise SourceUnavailable("serve.model", f"job {job_id} names no base model")
    if continued_job(source) is not None:
        folder = job_model_folder(settings, "serve.model", source)
        if is_adapter(folder):
            raise SpecError("serve.model", f"the base of {model} ({source}) is a LoRA adapter too: chat "
                                           "with a job exported with export.merge_lora")
        return str(folder)
    if source.startswith("file:"):
        raise SpecError("serve.model", f"the base of {model} is an uploaded file ({source}): chat with a "
                                       "job exported with export.merge_lora")
    return resolve_source_location(source, Path(settings.models_root), None, "serve.model")


@dataclass
class _InFlight:
    request: RelayedRequest
    handle: object  # grpo_core.serving.engine.RequestHandle
    # Told ``started`` once the engine took it into the batch: a request it refuses (a prompt
    # longer than the model's positions) gets its 422 before the API has answered anything.
    started: bool = False


class ServeLoop:
    """The driver of one serving attempt: requests in from Redis, the engine's events out."""

    def __init__(self, job: JobRead, spec: ServeSpec, settings: Settings, files: AttemptFiles, client: Redis,
                 engine) -> None:
        self.job, self.spec, self.settings, self.files = job, spec, settings, files
        self.client, self.engine = client, engine
        self.queue = settings.redis_keys.serve_requests(job.id)
        # A pop blocks within the client's socket timeout, and briefly, for a prompt stop.
        self.block_seconds = min(1.0, bus.client_timeouts(settings).socket / 2)
        self.reply_ttl = int(settings.serve_wait_seconds) + 60
        self.in_flight: dict[str, _InFlight] = {}
        self.outgoing: list[tuple[RelayedRequest, object]] = []  # the engine's events, from its callbacks
        self.replies: list[tuple[str, str]] = []  # (reply key, event message) to push, in order
        self.served = self.prompt_tokens = self.completion_tokens = 0
        self.marks, self.marked_at, self.checked_at = 0, 0.0, 0.0

    def run(self) -> Outcome:
        idle_seconds = self.spec.serve.idle_seconds
        busy_at = time.monotonic()
        while True:
            self._mark_alive()
            stop = self.files.stop_reason()
            if stop is not None:
                return self._stopped(stop)
            room = self.spec.serve.max_batch - len(self.in_flight)
            if room > 0:
                self._take(self.client.lpop(self.queue, room) or [])
            if self.in_flight:
                self._step()
                busy_at = time.monotonic()
                continue
            idle = time.monotonic() - busy_at
            if idle >= idle_seconds:
                message = f"unloaded after {idle_seconds} s without a request"
                return Outcome(JobStatus.SUCCEEDED, message)
            wait = max(0.01, min(self.block_seconds, idle_seconds - idle))
            popped = self.client.blpop([self.queue], timeout=wait)
            if popped is not None:
                self._take([popped[1]])

    def _mark_alive(self) -> None:
        now = time.monotonic()
        if now - self.marked_at >= MARK_SECONDS:
            self.marks += 1
            self.marked_at = now
            self.files.mark_progress(0, self.marks)

    def _take(self, raw_requests: list[bytes]) -> None:
        """Submit each popped request to the engine (a malformed, expired or invalid one is
        dropped or answered at once)."""
        from grpo_core.serving.requests import parse_request

        for raw in raw_requests:
            try:
                request = read_request(raw)
            except ValueError as exc:
                log.warning("serving job %s: dropped a message: %s", self.job.id, exc)
                continue
            if request.expired():  # the API answered 503 already; nobody waits for it
                continue
            max_tokens = int(request.body.get("max_tokens") or 1)
            try:
                generation = parse_request(request.body, default_max_tokens=max_tokens,
                                           max_tokens_limit=max(1, max_tokens))
            except ValueError as exc:
                self._send(request, invalid(exc))
                continue
            handle = self.engine.submit(generation, lambda event, r=request: self.outgoing.append((r, event)))
            self.in_flight[request.id] = _InFlight(request, handle)
        self._flush()

    def _step(self) -> None:
        from grpo_core.serving.requests import Cancelled, Finished, TextDelta

        try:
            self.engine.step()
        finally:  # a failed step failed every request of the batch: they hear it
            events, self.outgoing = self.outgoing, []
            for request, event in events:
                flight = self.in_flight.get(request.id)
                if flight is not None and not flight.started and isinstance(event, TextDelta | Finished):
                    flight.started = True
                    self._send(request, Started())
                if isinstance(event, TextDelta):
                    self._send(request, Delta(text=event.text))
                    continue
                self.in_flight.pop(request.id, None)
                if isinstance(event, Finished):
                    self.served += 1
                    self.prompt_tokens += event.usage.prompt_tokens
                    self.completion_tokens += event.usage.completion_tokens
                    self._send(request, Done(finish_reason=event.finish_reason,
                                             prompt_tokens=event.usage.prompt_tokens,
                                             completion_tokens=event.usage.completion_tokens))
                elif not isinstance(event, Cancelled):  # a cancelled one's client is gone
                    self._send(request, failure(event.error))
            # Every request submitted is in the batch after a step (no more are submitted than it
            # holds): those with no text yet are started too.
            for flight in self.in_flight.values():
                if not flight.started:
                    flight.started = True
                    self._send(flight.request, Started())
            self._flush()
        self._cancel_abandoned()

    def _cancel_abandoned(self) -> None:
        """Cancel the requests whose clients went away (their cancel keys), a few times a second."""
        now = time.monotonic()
        if not self.in_flight or now - self.checked_at < CANCEL_CHECK_SECONDS:
            return
        self.checked_at = now
        flights = list(self.in_flight.values())
        with self.client.pipeline(transaction=False) as pipe:
            for flight in flights:
                pipe.exists(flight.request.cancel)
            gone = pipe.execute()
        for flight, cancelled in zip(flights, gone, strict=True):
            if cancelled:
                flight.handle.cancel()

    def _stopped(self, stop: StopRequest) -> Outcome:
        """Asked to stop: every request in flight or waiting is answered 503 (retry), then the
        attempt ends as the stop asks."""
        self.answer_all_unavailable(f"the serving job was {_STOPPED[StopRequest(stop)]}")
        return outcome_for_stop(stop, 0)

    def answer_all_unavailable(self, why: str) -> None:
        """503 to each request in the batch (cancelled in the engine) and each one still queued."""
        unavailable = Failed(status=503, code=UNAVAILABLE, message=f"{why} while it generated this "
                             "answer; send the request again")
        for flight in self.in_flight.values():
            flight.handle.cancel()
            self._send(flight.request, unavailable)
        self.in_flight.clear()
        try:
            self._flush()
        except RedisError as exc:
            log.warning("serving job %s: could not answer its requests: %s", self.job.id, exc)
        queued = unavailable.model_copy(
            update={"message": f"{why} before it took this request; send it again"})
        answer_waiting(self.client, self.settings, self.job.id, queued)

    def _send(self, request: RelayedRequest, event: Started | Delta | Done | Failed) -> None:
        self.replies.append((request.reply, event_message(event)))

    def _flush(self) -> None:
        """Push the events gathered, in order, each reply key with its TTL, in one round trip."""
        replies = self.replies
        if not replies:
            return
        with self.client.pipeline(transaction=False) as pipe:
            for key, message in replies:
                pipe.rpush(key, message)
            for key in {key for key, _ in replies}:
                pipe.expire(key, self.reply_ttl)
            pipe.execute()
        replies.clear()


def answer_waiting(client: Redis, settings: Settings, job_id: int, event: Failed) -> None:
    """Answer ``event`` to every request waiting in the job's list (none is left there)."""
    try:
        waiting = client.lpop(settings.redis_keys.serve_requests(job_id), 10_000) or []
        replies = []
        for raw in waiting:
            try:
                replies.append(read_request(raw).reply)
            except ValueError:
                continue
        with client.pipeline(transaction=False) as pipe:
            for reply in replies:
                pipe.rpush(reply, event_message(event))
                pipe.expire(reply, int(settings.serve_wait_seconds) + 60)
            pipe.execute()
    except RedisError as exc:
        log.warning("serving job %s: could not answer the requests waiting for it: %s", job_id, exc)


def invalid(error: ValueError) -> Failed:
    """A request the model cannot take: a 422 naming its field (the engine's and the request's
    messages start with it: ``messages[2].role: ...``)."""
    message = str(error)
    field, _, _ = message.partition(":")
    return Failed(status=422, code=INVALID_REQUEST, message=message, param=param_of(field))


def param_of(field: str) -> str | None:
    """``messages[2].role`` as the API names fields: ``messages.2.role``."""
    field = field.strip()
    if not field or " " in field:
        return None
    return field.replace("[", ".").replace("]", "")


def failure(error: Exception) -> Failed:
    """The engine's failure of one request: its own (a ValueError naming the field) or the
    batch's (the model failed: the service's, retry)."""
    if isinstance(error, ValueError):
        return invalid(error)
    if isinstance(error, GRPOError):
        return Failed(status=503, code=UNAVAILABLE, message=f"the model failed: {error.message}; retry")
    return Failed(status=503, code=UNAVAILABLE,
                  message=f"the model failed ({type(error).__name__}: {error}); retry")
