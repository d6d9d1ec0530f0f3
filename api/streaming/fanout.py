"""One reader per job per process: each job's stream is XREAD once for all its connections.

A job's hub is one asyncio task, started when the job's first subscriber attaches and stopped
when its last one leaves. It reads the job's stream, decodes and translates each entry once
(:class:`~api.streaming.messages.Entry`) and offers it to every subscriber, each with its own
cursor (its backlog was read at its own ``after``) and its own bounded queue.

Writers (API, scheduler, worker) publish every event with its row id and every status change,
so the stream alone keeps clients current. An entry only SQL may send (a status, which goes out
with the job's row, or an event without its id) makes the hub re-read the row and events at
once, after the batch that carried it. The other SQL re-reads are a safety net for a publish
that failed, one read per job for all its subscribers: everything after an XREAD that waited
``block_ms`` for nothing (a job that ended unannounced), the row and events every ``recheck_s``
on a busy stream.

No gap: a subscriber notes the stream's newest id (its ``start``) before its SQL backlog read
and must get every entry after it. The hub keeps its recent entries in a ring; a subscriber
whose ``start`` is not older than the ring's floor replays the ring's entries after ``start``
and skips the hub's later entries at or before it. One whose ``start`` fell out of the ring is
refused (:meth:`Hubs.attach` returns None): it reads SQL again with a fresh ``start``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from api.redis_keys import RedisKeys
from api.streaming.catch_up import catch_up
from api.streaming.config import StreamConfig
from api.streaming.cursor import Cursor, StreamId, format_id
from api.streaming.messages import Entry
from api.streaming.subscriber import Subscriber


@dataclass
class Hubs:
    """This process's hubs (one set per app and Redis client), by job id."""

    redis: Any  # an asyncio Redis client
    database_url: str
    keys: RedisKeys
    config: StreamConfig = field(default_factory=StreamConfig)
    jobs: dict[int, JobHub] = field(default_factory=dict)

    def subscriber_count(self) -> int:
        return sum(len(hub.subscribers) for hub in self.jobs.values())

    def attach(self, job_id: int, subscriber: Subscriber) -> JobHub | None:
        """Join the job's hub (started if none runs); None when ``subscriber.start`` is too old."""
        hub = self.jobs.get(job_id)
        if hub is None:
            hub = self.jobs[job_id] = JobHub(self, job_id, subscriber.start)
        return hub if hub.attach(subscriber) else None


class JobHub:
    """The shared reader of one job's stream; see the module docstring."""

    def __init__(self, hubs: Hubs, job_id: int, start: StreamId) -> None:
        self.hubs, self.job_id = hubs, job_id
        self.position = self.floor = start  # read up to; the ring holds every entry after floor
        self.ring: deque[Entry] = deque(maxlen=hubs.config.ring_size)
        self.subscribers: dict[Subscriber, None] = {}  # insertion-ordered set
        self.asked = False  # an entry needs the job's row: re-read SQL after this batch
        self.task = asyncio.create_task(self._run(), name=f"stream-hub-{job_id}")

    def attach(self, subscriber: Subscriber) -> bool:
        if subscriber.start < self.floor:
            return False
        for entry in self.ring:  # what the hub read after the subscriber's start
            subscriber.offer(entry)
            # an entry only SQL may send, which the hub's last re-read may have done without it
            self.asked = self.asked or (entry.text is None and entry.id > subscriber.start)
        self.subscribers[subscriber] = None
        return True

    def detach(self, subscriber: Subscriber) -> None:
        self.subscribers.pop(subscriber, None)
        if not self.subscribers:
            self._stop()

    def _stop(self) -> None:
        if self.hubs.jobs.get(self.job_id) is self:
            del self.hubs.jobs[self.job_id]
        self.task.cancel()

    async def _run(self) -> None:
        try:
            await self._tail()
            error = None  # terminal: the catch-up queued every subscriber's end marker
        except asyncio.CancelledError:
            raise
        except Exception as failure:  # Redis, SQL or a bad entry: every subscriber ends with it
            error = failure
        if self.hubs.jobs.get(self.job_id) is self:
            del self.hubs.jobs[self.job_id]
        for subscriber in list(self.subscribers):
            subscriber.finish(error)
        self.subscribers.clear()

    async def _tail(self) -> None:
        """Read and fan out until a SQL read finds the job terminal (module docstring: when)."""
        redis, config, key = self.hubs.redis, self.hubs.config, self.hubs.keys.job_stream(self.job_id)
        loop = asyncio.get_running_loop()
        checked_at = loop.time()
        while True:
            position = format_id(self.position)
            reply = await redis.xread({key: position}, count=config.batch, block=config.block_ms)
            entries = reply[0][1] if reply else []
            for raw_id, fields in entries:
                entry = self._read(raw_id, fields)
                self.asked = self.asked or entry.text is None
                for subscriber in list(self.subscribers):
                    subscriber.offer(entry)
            if not entries or self.asked or loop.time() - checked_at > config.recheck_s:
                self.asked = False  # one raised during the read asks for the next one
                if await self._check(steps=not entries):
                    return
                checked_at = loop.time()

    async def _check(self, steps: bool) -> bool:
        """One SQL read for every subscriber, from the lowest of their cursors; True: terminal.
        With ``steps`` (a quiet stream) metrics and samples too, else only the row and events:
        a busy stream's steps come through it."""
        subscribers = list(self.subscribers)
        if not subscribers:
            return False
        floor = Cursor.lowest(s.cursor for s in subscribers)
        url = self.hubs.database_url
        return await catch_up(url, self.job_id, subscribers, floor, wait=False, steps=steps)

    def _read(self, raw_id: bytes | str, fields: dict) -> Entry:
        entry = Entry.read(raw_id, fields)
        if len(self.ring) == self.ring.maxlen:
            self.floor = self.ring[0].id  # about to drop out: a joiner must start at or after it
        self.ring.append(entry)
        self.position = entry.id
        return entry
