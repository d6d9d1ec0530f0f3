"""A chat request relayed to its serving job and its answer read back (``/v1/chat/completions``,
``/v1/completions``; the routes are :mod:`api.http.routes.chat`).

1. **The serving job.** The model (``job:ID[@STEP]``) must be a job the caller may see (another
   team's is a 404, as for a download) that has that model now (a 409 saying what it lacks, the
   checks a ``job:`` source passes at submit); then the caller's team's live serving job of it is
   found, or one is queued (:func:`api.store.serving.find_or_start`, admitted like any job).
2. **The request** goes onto the serving job's list (``RedisKeys.serve_requests``) as a
   :class:`~api.domain.serve_messages.RelayedRequest`; its events are read from its reply key with
   the app's async client in short BLPOPs, so no thread nor the event loop waits.
3. **Waiting for a device.** Until the serving job takes it (``started``), the request waits up to
   ``GRPO_SERVE_WAIT_SECONDS``, then it is withdrawn from the list and answered 503 with
   Retry-After. Every couple of seconds the wait reads the job's status: a serving job that ended
   (idle, cancelled, paused) before it took the request has the request moved to the team's next
   serving job of the model, queued if need be.
4. **Generation.** Events come as the model writes; a serving job that stops under a request
   (preempted, paused, cancelled) answers it 503 itself, and one whose process vanished is noticed
   by its status (not running) after a silence: 503, never a hang. A client that goes away sets
   the request's cancel key, and the serving job drops it from the batch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio as aioredis
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from api.domain.errors import ClientGone, Conflict, InvalidInput, NotFound, Unavailable
from api.domain.serve_messages import (
    Delta,
    Done,
    Failed,
    RelayedRequest,
    Started,
    read_event,
    request_message,
)
from api.domain.serve_spec import LIVE_SERVING_STATUSES, SERVE, canonical_model, served_job
from api.http.auth import Principal
from api.http.submission import job_source_problem
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import serving
from api.store.db import session_scope
from api.store.jobs import get_job

# A serving job waiting for a device, or one that stopped under a request, frees up within about this.
RETRY_AFTER_SECONDS = 10
# How often a waiting request reads its serving job's status.
STATUS_CHECK_SECONDS = 2.0
# Serving job statuses in which a request it took is still being answered.
_ANSWERING = frozenset({"running", "cancelling", "pausing"})
Disconnected = Callable[[], Awaitable[bool]]


def serving_job_for(settings: Settings, app_state: State, principal: Principal, model: str) -> JobRead:
    """The caller's team's live serving job of ``model``, queued if there is none (in a thread:
    SQL, and the artifacts' folder or store)."""
    try:
        canonical = canonical_model(model)
    except ValueError as exc:
        raise InvalidInput(str(exc), param="model") from None
    job_id, _ = served_job(canonical)
    with session_scope(settings.database_url, publish=app_state.publish) as session:
        try:
            source = get_job(session, job_id, principal.scope)
        except NotFound:
            raise NotFound(f"model {canonical} not found: your team has no job {job_id}",
                           param="model") from None
        if source.kind == SERVE:
            raise NotFound(f"job {job_id} is a serving job: it has no model of its own; name the job it "
                           "serves", param="model")
        live = serving.live_serving_job(session, principal.team_id, canonical)
        if live is not None:  # its model was checked when it started, and it may have loaded it
            return live
        # The submit's checks of a job: source, as the team that owns the model (an admin may chat
        # with any team's job); it is held against deletion until this transaction ends.
        problem = job_source_problem(session, "model", canonical, source.team_id, settings)
        if problem is not None:
            raise Conflict(problem.reason, param="model")
        job, _ = serving.find_or_start(session, principal.team_id, canonical, settings,
                                       member=not principal.is_admin, pool=source.pool)
    return job


def _job_status(settings: Settings, job_id: int) -> tuple[str | None, str | None]:
    with session_scope(settings.database_url) as session:
        return serving.job_status(session, job_id)


class ChatRelay:
    """One request's way through its serving job. ``start`` pushes it and waits until the job
    took it; ``events`` then yields its deltas and its :class:`Done`; ``abandon`` withdraws it
    (its client went away)."""

    def __init__(self, client: aioredis.Redis, settings: Settings, app_state: State, principal: Principal,
                 model: str, body: dict[str, Any], job: JobRead) -> None:
        self.client, self.settings, self.app_state, self.principal = client, settings, app_state, principal
        self.model, self.job = model, job
        keys, request_id = settings.redis_keys, uuid.uuid4().hex
        self.request = RelayedRequest(id=request_id, body=body, reply=keys.serve_reply(request_id),
                                      cancel=keys.serve_cancel(request_id),
                                      deadline=time.time() + settings.serve_wait_seconds)
        self.message = request_message(self.request)
        self.block_seconds = settings.stream_block_seconds  # within the client's socket timeout
        self.ttl = int(settings.serve_wait_seconds) + 60
        self.done = False

    @property
    def queue(self) -> str:
        return self.settings.redis_keys.serve_requests(self.job.id)

    async def _push(self) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.rpush(self.queue, self.message)
            pipe.expire(self.queue, self.ttl)
            await pipe.execute()

    async def start(self, disconnected: Disconnected) -> None:
        """Push the request and wait until its serving job took it; :class:`Unavailable` (503)
        after ``GRPO_SERVE_WAIT_SECONDS``, the request's own error (422) if the job refused it."""
        await self._push()
        checked, taken_unseen = time.monotonic(), 0
        while True:
            left = self.request.deadline - time.time()
            if left <= 0:
                await self.abandon()
                raise Unavailable(
                    f"the serving job of {self.model} (job {self.job.id}) did not take the request "
                    f"within {self.settings.serve_wait_seconds:g} s: it waits for a device or loads "
                    "the model; retry", retry_after=RETRY_AFTER_SECONDS, param="model")
            event = await self._pop(min(left, self.block_seconds))
            if event is not None:
                self._raise_failure(event)
                if isinstance(event, Started):
                    return
                continue  # nothing else comes before started
            if await disconnected():
                await self.abandon()
                raise ClientGone("the client went away before the model took the request")
            if time.monotonic() - checked < STATUS_CHECK_SECONDS:
                continue
            checked = time.monotonic()
            status, error = await run_in_threadpool(_job_status, self.settings, self.job.id)
            if status in LIVE_SERVING_STATUSES:
                continue
            if status == "failed":  # its model could not load, say: another job would fail the same
                await self.abandon()
                raise Unavailable(f"the serving job of {self.model} (job {self.job.id}) failed: {error}",
                                  retry_after=RETRY_AFTER_SECONDS, param="model")
            # The job ended (idle, cancelled) or rests without taking it: to the next serving job.
            if await self.client.lrem(self.queue, 1, self.message):
                self.job = await run_in_threadpool(serving_job_for, self.settings, self.app_state,
                                                   self.principal, self.model)
                await self._push()
                continue
            taken_unseen += 1  # it took the request as it stopped: its events are on their way
            if taken_unseen > 1:
                await self.abandon()
                raise self._stopped(status)

    async def events(self, disconnected: Disconnected | None = None, *, quiet: bool = False
                     ) -> AsyncIterator[Delta | Done | None]:
        """The request's deltas, then its :class:`Done`; :class:`Unavailable` when its serving job
        stopped under it (retry). ``quiet``: a None after each wait with nothing, so a stream can
        write something (a comment) and learn that its client left."""
        checked = silent_since = time.monotonic()
        while True:
            event = await self._pop(self.block_seconds)
            if event is None and quiet:
                yield None
            if event is not None:
                silent_since = time.monotonic()
                self._raise_failure(event)
                if isinstance(event, Delta):
                    yield event
                elif isinstance(event, Done):
                    self.done = True
                    yield event
                    return
                continue
            if disconnected is not None and await disconnected():
                await self.abandon()
                raise ClientGone("the client went away while the model wrote its answer")
            now = time.monotonic()
            if now - silent_since > self.settings.serve_wait_seconds:
                await self.abandon()
                raise Unavailable(f"the serving job of {self.model} stopped answering; retry",
                                  retry_after=RETRY_AFTER_SECONDS, param="model")
            if now - checked >= STATUS_CHECK_SECONDS and now - silent_since >= STATUS_CHECK_SECONDS:
                checked = now
                status, _ = await run_in_threadpool(_job_status, self.settings, self.job.id)
                if status not in _ANSWERING:  # its process is gone: nobody writes this answer
                    await self.abandon()
                    raise self._stopped(status)

    async def abandon(self) -> None:
        """Withdraw the request: out of the job's list if it is still there, its cancel key set
        for a job that took it, its reply key gone. Safe to call more than once."""
        if self.done:
            return
        self.done = True
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.lrem(self.queue, 1, self.message)
            pipe.set(self.request.cancel, b"1", ex=self.ttl)
            pipe.delete(self.request.reply)
            await pipe.execute()

    async def abandon_shielded(self) -> None:
        """:meth:`abandon` from a response being cancelled (its client disconnected)."""
        with anyio.CancelScope(shield=True):
            await self.abandon()

    async def _pop(self, timeout: float) -> Started | Delta | Done | Failed | None:
        # Never 0 ms, which blocks forever; within the client's socket timeout.
        popped = await self.client.blpop([self.request.reply], timeout=max(timeout, 0.01))
        return None if popped is None else read_event(popped[1])

    def _raise_failure(self, event: Started | Delta | Done | Failed) -> None:
        if not isinstance(event, Failed):
            return
        self.done = True
        if event.status == 422:
            raise InvalidInput(event.message, param=event.param)
        raise Unavailable(event.message, retry_after=RETRY_AFTER_SECONDS, param="model")

    def _stopped(self, status: str | None) -> Unavailable:
        return Unavailable(f"the serving job of {self.model} (job {self.job.id}) is {status or 'gone'} and "
                           "did not finish this answer; retry", retry_after=RETRY_AFTER_SECONDS,
                           param="model")
