"""``WS /v1/jobs/{id}/stream?after=STEP&after_event=ID``: a job's training signals, live.

Auth: ``Authorization: Bearer T`` or, for browsers, ``?token=T``. A bad token, an unknown job or
a bad query is refused in the handshake with the API's usual HTTP error (401/404/422).

On connect the server sends, from SQL, the job's events after ``after_event`` and its metrics
and samples after step ``after`` (0, the default: everything; at most the 20 newest samples),
then the job's current ``status``. It then tails the Redis Stream ``grpo:job:{id}`` from the
entry that was last *before* the SQL read, so nothing published meanwhile is lost; duplicates
are dropped (a step, sample step or event id at or before the last one sent is skipped), so
each step arrives exactly once and in order. Whenever the stream is quiet for a second the
server re-reads SQL, which catches a job that finished in between and anything the stream
missed; a busy stream re-reads the job and its events every few seconds (the API and the
scheduler write events without publishing them). When the job is terminal the last message is
its ``status``, then a close with 1000. One reader per job per process (``api.streaming.hub``)
tails the stream and re-reads SQL for all of a job's connections; each keeps its own cursor.

Messages (JSON text frames)::

    {"type": "metrics", "step": N, "values": {...}}        one optimizer step, DESIGN §5 names
    {"type": "event",   "event": {"id", "ts", "level", "type", "message", "data"}}
    {"type": "samples", "step": N, "rows": [...]}           sample completions of step N
    {"type": "status",  "status": "running", "job": {...}}  on connect and on each change; job is JobRead

Close codes: 1000 the job finished; 1013 the client read too slowly (its queue of
``QUEUE_SIZE`` messages filled; reconnect with ``after=<last step seen>``); 1011 server error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, WebSocket
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.lifecycle import TERMINAL_STATUSES
from api.schemas.jobs import JobRead
from api.store import bus, telemetry
from api.store import jobs as job_store
from api.store.db import session_scope
from api.streaming.hub import Cursor, Hubs, JobHub, SlowClient, Subscriber, parse_id

log = logging.getLogger(__name__)
router = APIRouter(tags=["stream"])

QUEUE_SIZE = 256  # messages a client may fall behind before it is cut off (1013)
BLOCK_MS = 1000  # XREAD wait; also how often a quiet stream re-checks the job in SQL
SQL_RECHECK_S = 5.0  # a busy stream re-checks too: events the API or scheduler write are not published
STREAM_BATCH = QUEUE_SIZE // 2  # one XREAD's entries never fill a queue the client keeps up with
BACKLOG_PAGE = 500
BACKLOG_PUT_TIMEOUT_S = 30.0  # the first backlog waits for room in the queue; nothing after it does
CLOSE_GRACE_S = 5.0  # a slow client's close frame waits behind what it has not read yet
SAMPLES_BACKLOG = 20
EVENT_FIELDS = ("id", "ts", "level", "type", "message", "data")
_END = None  # queued after the final status: the sender closes with 1000


def to_client(kind: str, data: dict[str, Any], job: JobRead | None = None) -> dict[str, Any]:
    """A stream entry (``api.store.bus`` shapes, which the SQL backlog reuses) → the client message."""
    if kind == "metrics":
        return {"type": "metrics", "step": int(data["step"]), "values": data}
    if kind == "samples":
        return {"type": "samples", "step": int(data["step"]), "rows": data["rows"]}
    if kind == "event":
        return {"type": "event", "event": {name: data.get(name) for name in EVENT_FIELDS}}
    if kind == "status":
        return {
            "type": "status",
            "status": data["status"],
            "job": job.model_dump(mode="json") if job is not None else None,
        }
    raise ValueError(f"unknown message type '{kind}'; valid: {', '.join(bus.MESSAGE_TYPES)}")


@dataclass
class _Connection:
    job_id: int
    team_id: int | None  # None: any team's job (the hub's re-checks; the handshake checked the team)
    database_url: str
    redis: Any
    cursor: Cursor


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
    await websocket.accept()
    conn = _Connection(
        job_id,
        principal.scope,
        settings.database_url,
        redis,
        Cursor(step=after, sample_step=after, event_id=after_event),
    )
    code = await _serve(websocket, conn, _hubs(websocket, conn))
    if code is not None:
        with contextlib.suppress(Exception):  # the client may already be gone
            await asyncio.wait_for(websocket.close(code), CLOSE_GRACE_S)


def _job_or_404(url: str, job_id: int, team_id: int | None) -> JobRead:
    with session_scope(url) as session:
        return job_store.get_job(session, job_id, team_id)


def _hubs(websocket: WebSocket, conn: _Connection) -> Hubs:
    """The app's job hubs, made with (and for the lifetime of) its Redis client."""
    state = websocket.app.state
    hubs = getattr(state, "stream_hubs", None)
    if hubs is None or hubs.redis is not conn.redis:
        check = functools.partial(_recheck, conn.database_url)
        hubs = state.stream_hubs = Hubs(conn.redis, _translate, check, BLOCK_MS, STREAM_BATCH, SQL_RECHECK_S)
    return hubs


async def _serve(websocket: WebSocket, conn: _Connection, hubs: Hubs) -> int | None:
    """Run reader, sender and disconnect watcher; the close code to send, None if the client left."""
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=QUEUE_SIZE)
    producer = asyncio.create_task(_produce(conn, queue, hubs))
    sender = asyncio.create_task(_send_all(websocket, queue))
    watcher = asyncio.create_task(_until_disconnect(websocket))
    tasks = {producer, sender, watcher}
    try:
        while True:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                return None
            if sender in done:
                return 1000 if sender.result() else None
            tasks.discard(producer)  # it finished: the sender still drains the queue
            error = producer.exception()
            if isinstance(error, SlowClient):
                log.info("job %s stream: client too slow, disconnecting", conn.job_id)
                return 1013
            if error is not None:
                log.error("job %s stream failed", conn.job_id, exc_info=error)
                return 1011
    finally:
        for task in (producer, sender, watcher):
            task.cancel()
        await asyncio.gather(producer, sender, watcher, return_exceptions=True)


async def _send_all(websocket: WebSocket, queue: asyncio.Queue) -> bool:
    """Send until the end marker (True) or until the client is gone (False). Messages come
    JSON-encoded (once for every subscriber), as ``send_json`` would encode them."""
    try:
        while (message := await queue.get()) is not _END:
            await websocket.send_text(message)
    except WebSocketDisconnect:
        return False
    return True


async def _until_disconnect(websocket: WebSocket) -> None:
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass  # the client has nothing to say; reading only notices when it leaves


async def _produce(conn: _Connection, queue: asyncio.Queue, hubs: Hubs) -> None:
    """SQL backlog, then the job's hub, until the job is terminal. The backlog waits for room in
    the queue; after it, a full queue raises :class:`SlowClient`. The stream id noted before
    each SQL read is where the live tail starts, so nothing published meanwhile is lost; if the
    hub no longer holds the entries after it, the backlog is read again from a fresh id."""
    subscriber = Subscriber(conn.cursor, queue, BACKLOG_PUT_TIMEOUT_S)
    hub: JobHub | None = None
    try:
        while hub is None and not subscriber.ended.is_set():
            newest = await conn.redis.xrevrange(bus.stream_key(conn.job_id), "+", "-", count=1)
            subscriber.start = parse_id(newest[0][0]) if newest else (0, 0)  # before the SQL read
            await _catch_up(conn, [subscriber], dataclasses.replace(conn.cursor), wait=True)
            if not subscriber.ended.is_set():
                hub = hubs.attach(conn.job_id, subscriber)
        await subscriber.ended.wait()
    finally:
        if hub is not None:
            hub.detach(subscriber)
    if subscriber.error is not None:
        raise subscriber.error


def _translate(message: dict[str, Any]) -> str | None:
    """A decoded stream entry → its client message as JSON, or None when SQL must send it."""
    return None if _needs_sql(message) else _encode(to_client(message["type"], message["data"]))


def _encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)  # as send_json does


def _needs_sql(message: dict[str, Any]) -> bool:
    """A status is sent from the job's row (the truth, and it carries the JobRead); an event
    published without its row id cannot be de-duplicated, so the row is fetched instead."""
    return message["type"] == "status" or (
        message["type"] == "event" and not isinstance(message["data"].get("id"), int)
    )


async def _recheck(
    database_url: str, job_id: int, subscribers: list[Subscriber], floor: Cursor, steps: bool
) -> bool:
    """A hub's SQL re-check: one read for all its subscribers, from the lowest of their cursors
    (``floor``). A quiet stream re-reads everything (the job may have ended unannounced, or a
    publish failed); a busy one re-reads only the row and events, as its steps come through it."""
    conn = _Connection(job_id, None, database_url, None, floor)
    return await _catch_up(conn, subscribers, floor, wait=False, steps=steps)


async def _catch_up(
    conn: _Connection, subscribers: list[Subscriber], floor: Cursor, wait: bool, steps: bool = True
) -> bool:
    """Send what SQL has beyond ``floor`` (events; metrics and samples too with ``steps`` or
    once the job is terminal) to each subscriber past its own cursor, then the job's status to
    each it is news to. True when the job is terminal: its final status and the end marker are
    queued. Reads in pages (``floor`` moves past each), so a long backlog never sits in memory
    whole; only with ``wait`` (a connection's backlog) does a put wait for room in a queue."""
    more = True
    while more:
        job, news, more = await run_in_threadpool(_read_news, conn, floor, steps)
        subscribers = [s for s in subscribers if not s.ended.is_set()]
        if not subscribers:
            return False
        for kind, data in news:
            floor.admit(kind, data)
            text = None
            for subscriber in subscribers:
                if subscriber.cursor.admit(kind, data):
                    text = text or _encode(to_client(kind, data))
                    await subscriber.put(text, wait)
    status, text = {"status": job.status}, _encode(to_client("status", {"status": job.status}, job))
    for subscriber in subscribers:
        if subscriber.cursor.admit("status", status):
            await subscriber.put(text, wait)
    if job.status not in TERMINAL_STATUSES:
        return False
    for subscriber in subscribers:
        await subscriber.put(_END, wait)
        subscriber.finish()
    return True


def _read_news(
    conn: _Connection, cursor: Cursor, steps: bool
) -> tuple[JobRead, list[tuple[str, dict[str, Any]]], bool]:
    """The job, then one page of what it has past ``cursor`` in ``api.store.bus`` shapes, and whether
    more pages follow. The job is read first: the worker writes telemetry before it ends a job,
    so a terminal status read here means the telemetry read after it is complete."""
    metrics, samples = [], []
    with session_scope(conn.database_url) as session:
        job = job_store.get_job(session, conn.job_id, conn.team_id)
        events = telemetry.list_events(session, conn.job_id, after=cursor.event_id, limit=BACKLOG_PAGE)
        if steps or job.status in TERMINAL_STATUSES:
            metrics = telemetry.list_metrics(session, conn.job_id, after_step=cursor.step, limit=BACKLOG_PAGE)
            samples = telemetry.list_samples(session, conn.job_id, limit=SAMPLES_BACKLOG)
    news = [("event", event.model_dump(mode="json")) for event in events]
    news += [("metrics", metric.values) for metric in metrics]
    news += [
        ("samples", {"step": row.step, "rows": row.rows})
        for row in reversed(samples)
        if row.step > cursor.sample_step
    ]
    return job, news, BACKLOG_PAGE in (len(events), len(metrics))
