"""``WS /v1/jobs/{id}/stream?after=STEP&after_event=ID``: a job's training signals, live.

Auth: ``Authorization: Bearer T`` or, for browsers, ``?token=T``. A bad token, an unknown job or
a bad query is refused in the handshake with the API's usual HTTP error (401/404/422).

On connect the server sends, from SQL, the job's events after ``after_event`` and its metrics
and samples after step ``after`` (0, the default: everything; at most the 20 newest samples),
then the job's current ``status``. It then tails the Redis Stream ``grpo:job:{id}`` from the
entry that was last *before* the SQL read, so nothing published meanwhile is lost; duplicates
are dropped (a step, sample step or event id at or before the last one sent is skipped), so
each step arrives exactly once and in order. Whoever writes an event or changes the job's
status (the API, the scheduler, the worker) publishes it to that stream once it has committed:
events come with their row id and are sent as they arrive; a status change makes the server
re-read the job's row at once and send the ``status`` with it. SQL is also re-read as a safety
net for a publish that failed: after a second of quiet stream (which catches a job that ended
unannounced), and every five seconds on a busy one (``GRPO_STREAM_BLOCK_SECONDS``,
``GRPO_STREAM_RECHECK_SECONDS``). When the job is terminal the last message is
its ``status``, then a close with 1000. One reader per job per process tails the stream and
re-reads SQL for all of a job's connections; each keeps its own cursor (``api.streaming``).

Messages (JSON text frames)::

    {"type": "metrics", "step": N, "values": {...}}        one optimizer step, DESIGN §5 names
    {"type": "event",   "event": {"id", "ts", "level", "type", "message", "data"}}
    {"type": "samples", "step": N, "rows": [...]}           sample completions of step N
    {"type": "status",  "status": "running", "job": {...}}  on connect and on each change; job is JobRead

Close codes: 1000 the job finished; 1013 try again later: the client read too slowly (its queue of
256 messages filled) or Redis or the database went away (reconnect with ``after=<last step
seen>``); 1011 server error. While Redis or the database is down the handshake itself is refused
with 503 ``unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

from fastapi import APIRouter, Query, WebSocket
from starlette.concurrency import run_in_threadpool

from api import streaming
from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.schemas.jobs import JobRead
from api.store import jobs as job_store
from api.store.db import session_scope

router = APIRouter(tags=["stream"])

CLOSE_GRACE_S = 5.0  # a slow client's close frame waits behind what it has not read yet


@router.websocket("/jobs/{job_id}/stream")
async def stream_job(
    websocket: WebSocket,
    job_id: int,
    principal: PrincipalDep,
    settings: SettingsDep,
    redis: RedisDep,
    after: Annotated[int, Query(ge=0)] = 0,
    after_event: Annotated[int, Query(ge=0)] = 0,
) -> None:
    await run_in_threadpool(_job_or_404, settings.database_url, job_id, principal.scope)
    # Redis down: refused here with 503 (the app's outage handler) rather than accepted and then
    # closed, since the stream could not start.
    await redis.ping()
    await websocket.accept()
    hubs = streaming.hubs_for(websocket.app.state, redis, settings)
    cursor = streaming.Cursor(step=after, sample_step=after, event_id=after_event)
    code = await streaming.serve(websocket, hubs, job_id, cursor)
    if code is not None:
        with contextlib.suppress(Exception):  # the client may already be gone
            await asyncio.wait_for(websocket.close(code), CLOSE_GRACE_S)


def _job_or_404(url: str, job_id: int, team_id: int | None) -> JobRead:
    with session_scope(url) as session:
        return job_store.get_job(session, job_id, team_id)
