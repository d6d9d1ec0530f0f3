"""The entry point: :func:`serve` runs one accepted WebSocket's stream of a job to its end.

A connection's producer reads its SQL backlog past the client's cursor, then joins the job's
hub (:mod:`api.streaming.fanout`); its sender writes the queued messages; a watcher notices the
client leaving. :func:`serve` returns the close code for the caller to send.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from api.outages import backend_down
from api.settings import Settings
from api.streaming.catch_up import catch_up
from api.streaming.config import StreamConfig
from api.streaming.cursor import Cursor, parse_id
from api.streaming.fanout import Hubs, JobHub
from api.streaming.subscriber import END, SlowClient, Subscriber

log = logging.getLogger(__name__)

# Close codes: the job finished; "try again later" (the client read too slowly, or Redis or the
# database went away: reconnecting with its cursor loses nothing once they are back); server error.
DONE, TRY_AGAIN, FAILED = 1000, 1013, 1011


def hubs_for(state: Any, redis: Any, settings: Settings) -> Hubs:
    """The app's job hubs (kept on its ``state``), made with and for the life of its Redis client."""
    hubs = getattr(state, "stream_hubs", None)
    if hubs is None or hubs.redis is not redis:
        hubs = state.stream_hubs = Hubs(redis, settings.database_url, settings.redis_keys,
                                         StreamConfig.from_settings(settings))
    return hubs


async def serve(websocket: WebSocket, hubs: Hubs, job_id: int, cursor: Cursor) -> int | None:
    """Stream job ``job_id`` past ``cursor`` to an accepted ``websocket`` (whose caller may read
    the job) until the job ends; the close code to send, None when the client left first."""
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=hubs.config.queue_size)
    subscriber = Subscriber(cursor, queue, hubs.config.backlog_put_timeout_s)
    producer = asyncio.create_task(_produce(hubs, job_id, subscriber))
    sender = asyncio.create_task(_send_all(websocket, queue))
    watcher = asyncio.create_task(_until_disconnect(websocket))
    tasks = {producer, sender, watcher}
    try:
        while True:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                return None
            if sender in done:
                return DONE if sender.result() else None
            tasks.discard(producer)  # it finished: the sender still drains the queue
            error = producer.exception()
            if isinstance(error, SlowClient):
                log.info("job %s stream: client too slow, disconnecting", job_id)
                return TRY_AGAIN
            if error is not None and backend_down(error):
                log.warning("job %s stream: %s went away (%s); closing with 1013", job_id,
                            backend_down(error), error)
                return TRY_AGAIN
            if error is not None:
                log.error("job %s stream failed", job_id, exc_info=error)
                return FAILED
    finally:
        for task in (producer, sender, watcher):
            task.cancel()
        await asyncio.gather(producer, sender, watcher, return_exceptions=True)


async def _send_all(websocket: WebSocket, queue: asyncio.Queue) -> bool:
    """Send until the end marker (True) or until the client is gone (False). Messages come
    JSON-encoded (once for every subscriber), as ``send_json`` would encode them."""
    try:
        while (message := await queue.get()) is not END:
            await websocket.send_text(message)
    except WebSocketDisconnect:
        return False
    return True


async def _until_disconnect(websocket: WebSocket) -> None:
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass  # the client has nothing to say; reading only notices when it leaves


async def _produce(hubs: Hubs, job_id: int, subscriber: Subscriber) -> None:
    """SQL backlog, then the job's hub, until the job is terminal. The backlog waits for room in
    the queue; after it, a full queue raises :class:`SlowClient`. The stream id noted before
    each SQL read is where the live tail starts, so nothing published meanwhile is lost; if the
    hub no longer holds the entries after it, the backlog is read again from a fresh id."""
    hub: JobHub | None = None
    try:
        while hub is None and not subscriber.ended.is_set():
            newest = await hubs.redis.xrevrange(hubs.keys.job_stream(job_id), "+", "-", count=1)
            subscriber.start = parse_id(newest[0][0]) if newest else (0, 0)  # before the SQL read
            floor = dataclasses.replace(subscriber.cursor)
            await catch_up(hubs.database_url, job_id, [subscriber], floor, wait=True)
            if not subscriber.ended.is_set():
                hub = hubs.attach(job_id, subscriber)
        await subscriber.ended.wait()
    finally:
        if hub is not None:
            hub.detach(subscriber)
    if subscriber.error is not None:
        raise subscriber.error
