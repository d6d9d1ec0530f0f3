"""``WS /v1/jobs/{id}/stream?after=STEP&after_event=ID``: a job's training signals, live.

Auth: ``Authorization: Bearer T`` or, for browsers, the subprotocols ``grpo.v1`` plus
``grpo.ticket.<ticket>`` (a single-use ticket from ``POST /v1/stream-tickets``) or
``grpo.bearer.<key>``; ``?ticket=`` also works. A key never goes in the URL (``?token=`` is
refused). A bad credential, an unknown job or a bad query is refused in the handshake with the
API's usual HTTP error (401/404/422). An open stream is closed with 4401 once its key is
revoked: at once when the revocation came through this process, else within
``GRPO_AUTH_CACHE_SECONDS`` (at least a second), how often it re-checks the key in SQL.

On connect the server sends, from SQL, the job's events after ``after_event`` and its metrics
and samples after step ``after`` (-1, the default: everything, step 0's evaluation included;
at most the 20 newest samples), then the job's current ``status``. It then tails the job's
Redis Stream (``RedisKeys.job_stream``) from the entry that was last *before* the SQL read, so
nothing published meanwhile is lost; duplicates are dropped (a step, sample step or event id
at or before the last one sent is skipped), so each step arrives exactly once and in order.
Whoever writes an event or changes the job's status (the API, the scheduler, the worker)
publishes it to that stream once it has committed:
events come with their row id and are sent as they arrive; a status change makes the server
re-read the job's row at once and send the ``status`` with it. SQL is also re-read as a safety
net for a publish that failed: after a second of quiet stream (which catches a job that ended
unannounced), and every five seconds on a busy one (``GRPO_STREAM_BLOCK_SECONDS``,
``GRPO_STREAM_RECHECK_SECONDS``). When the job is terminal the last message is
its ``status``, then a close with 1000. One reader per job per process tails the stream and
re-reads SQL for all of a job's connections; each keeps its own cursor (``api.streaming``).

Messages (JSON text frames)::

    {"type": "metrics", "step": N, "values": {...}}        one optimizer step, docs/architecture.md §5 names
    {"type": "event",   "event": {"id", "ts", "level", "type", "message", "data"}}
    {"type": "samples", "step": N, "rows": [...]}           sample completions of step N
    {"type": "status",  "status": "running", "job": {...}}  on connect and on each change; job is JobRead

Close codes: 1000 the job finished; 1013 try again later: the client read too slowly (its queue of
256 messages filled) or Redis or the database went away (reconnect with ``after=<last step
seen>``); 1011 server error; 4401 the key was revoked. While Redis or the database is down the
handshake itself is refused with 503 ``unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated

from fastapi import APIRouter, WebSocket, status
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api import streaming
from api.domain.errors import Unauthorized
from api.http import stream_auth
from api.http.auth import KeyCache, Principal
from api.http.deps import KeyCacheDep, PrincipalDep, RedisDep, SettingsDep, principal_for_key
from api.http.params import JobId, id_cursor, step_cursor
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import jobs as job_store
from api.store.db import session_scope
from api.vocabulary import BEFORE_FIRST_STEP

log = logging.getLogger(__name__)
router = APIRouter(tags=["stream"])

CLOSE_GRACE_S = 5.0  # a slow client's close frame waits behind what it has not read yet
KEY_REVOKED = 4401  # close code: the key the stream was opened with no longer holds
MIN_KEY_RECHECK_S = 1.0  # with the key cache off (0 s), an open stream still asks SQL only once a second


class StreamTicket(BaseModel):
    ticket: str = Field(description="Offer it as the subprotocol `grpo.ticket.<ticket>` (with "
                                    "`grpo.v1`) or as `?ticket=`; single use")
    expires_in: int = Field(description="Seconds it stays valid if unused")


@router.post("/stream-tickets", status_code=status.HTTP_201_CREATED, response_model=StreamTicket)
async def create_stream_ticket(principal: PrincipalDep, settings: SettingsDep, redis: RedisDep
                               ) -> StreamTicket:
    """A short-lived, single-use ticket that opens one job stream as the caller, so a browser
    need not put its key in a WebSocket URL or subprotocol."""
    ticket = await stream_auth.issue_ticket(redis, settings, principal)
    return StreamTicket(ticket=ticket, expires_in=stream_auth.TICKET_TTL_SECONDS)


@router.websocket("/jobs/{job_id}/stream")
async def stream_job(
    websocket: WebSocket,
    job_id: JobId,
    principal: PrincipalDep,
    settings: SettingsDep,
    cache: KeyCacheDep,
    redis: RedisDep,
    after: Annotated[int, *step_cursor("Only steps after this one")] = BEFORE_FIRST_STEP,
    after_event: Annotated[int, *id_cursor("Only events after this id")] = 0,
) -> None:
    await run_in_threadpool(_job_or_404, settings.database_url, job_id, principal.scope)
    # Redis down: refused here with 503 (the app's outage handler) rather than accepted and then
    # closed, since the stream could not start.
    await redis.ping()
    await websocket.accept(subprotocol=stream_auth.selected_subprotocol(websocket))
    hubs = streaming.hubs_for(websocket.app.state, redis, settings)
    cursor = streaming.Cursor(step=after, sample_step=after, event_id=after_event)
    serving = asyncio.create_task(streaming.serve(websocket, hubs, job_id, cursor))
    watching = asyncio.create_task(_until_key_revoked(settings, cache, principal))
    try:
        done, _ = await asyncio.wait({serving, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (serving, watching):
            task.cancel()
        await asyncio.gather(serving, watching, return_exceptions=True)
    code = KEY_REVOKED if watching in done else serving.result()
    if code is not None:
        with contextlib.suppress(Exception):  # the client may already be gone
            await asyncio.wait_for(websocket.close(code), CLOSE_GRACE_S)


async def _until_key_revoked(settings: Settings, cache: KeyCache, principal: Principal) -> None:
    """Return once the stream's key is revoked (or deleted); never for the operator token or
    with auth off, which have no key. A revocation through this process's admin route ends the
    wait at once; one made elsewhere is seen by the SQL re-check made every interval."""
    if principal.key_hash is None or principal.key_id is None:
        await asyncio.Event().wait()
    interval = max(settings.auth_cache_seconds, MIN_KEY_RECHECK_S)
    with cache.revocation_watch(principal.key_id) as revoked:
        # Not (or no longer) cached: an eviction may have come between the handshake's lookup
        # and the watch, so SQL is asked at once rather than an interval later.
        check_now = cache.get(principal.key_hash) is None
        while True:
            if check_now and await _key_revoked(settings, cache, principal):
                break
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
                # cancellation that ends the stream, and this task would then never end.
                async with asyncio.timeout(interval):
                    await revoked.wait()
                break
            except TimeoutError:
                check_now = True
    log.info("closing a stream: its key %s was revoked", principal.key_prefix)


async def _key_revoked(settings: Settings, cache: KeyCache, principal: Principal) -> bool:
    """One SQL re-check of the stream's key, which sees a revocation made by another process."""
    try:
        await principal_for_key(settings, cache, principal.key_hash, fresh=True)
    except Unauthorized:
        return True
    except Exception as exc:  # noqa: BLE001 - a backend outage is not a revocation: check again
        log.warning("could not re-check a stream's key: %s", exc)
    return False


def _job_or_404(url: str, job_id: int, team_id: int | None) -> JobRead:
    with session_scope(url) as session:
        return job_store.get_job(session, job_id, team_id)
