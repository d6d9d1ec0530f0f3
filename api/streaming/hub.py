"""One reader per job per process for ``WS /v1/jobs/{id}/stream`` (``api.http.routes.stream``).

A job's hub is one asyncio task, started when the job's first subscriber attaches and stopped
when its last one leaves. It XREADs the job's stream once for all of them, decodes and
translates each entry once, and offers it to every subscriber. Each subscriber keeps its own
cursor (its SQL backlog was read at its own ``after``) and its own bounded queue: a full queue
ends that subscriber alone, with :class:`SlowClient`. The hub also runs the job's SQL re-check
(the route's ``check``), one read per job per interval on behalf of all its subscribers.

No gap: a subscriber notes the stream's newest id (its ``start``) before its SQL backlog read
and must get every entry after it. The hub keeps its recent entries in a ring; a subscriber
whose ``start`` is not older than the ring's floor replays the ring's entries after ``start``
and skips the hub's later entries at or before it. One whose ``start`` fell out of the ring is
refused (:meth:`Hubs.attach` returns None): it reads SQL again with a fresh ``start``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from api.store import bus

StreamId = tuple[int, int]  # (milliseconds, sequence): ordered as Redis orders entry ids
RING_SIZE = 512  # recent entries a late joiner may replay


def parse_id(raw: bytes | str) -> StreamId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class Cursor:
    """What this client has been sent; everything at or before it is a duplicate."""

    step: int = 0
    sample_step: int = 0
    event_id: int = 0
    status: str | None = None

    def admit(self, kind: str, data: dict[str, Any]) -> bool:
        """True (and move past it) the first time a step, sample step, event or status is seen."""
        if kind == "status":
            fresh = data["status"] != self.status
            self.status = data["status"]
            return fresh
        name = _CURSOR_FIELDS[kind]
        number = int(data["id"] if kind == "event" else data["step"])
        if number <= getattr(self, name):
            return False
        setattr(self, name, number)
        return True


_CURSOR_FIELDS = {"metrics": "step", "samples": "sample_step", "event": "event_id"}


class SlowClient(Exception):  # noqa: N818 - names the condition
    """The client's queue is full: it reads slower than the job publishes."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry, decoded and translated once for every subscriber."""

    id: StreamId
    kind: str
    data: dict[str, Any]
    text: str | None  # the client message as JSON; None: it must come from SQL instead


class Subscriber:
    """One connection's side of a hub: its cursor, its queue and where its backlog ends."""

    def __init__(self, cursor: Cursor, queue: asyncio.Queue, put_timeout_s: float) -> None:
        self.cursor, self.queue, self.put_timeout_s = cursor, queue, put_timeout_s
        self.start: StreamId = (0, 0)  # the newest stream id before its last SQL read
        self.ended = asyncio.Event()
        self.error: BaseException | None = None

    def offer(self, entry: Entry) -> None:
        """A live entry: queued unless SQL must send it, the backlog had it, or it is a duplicate."""
        if entry.text is not None and entry.id > self.start and self.cursor.admit(entry.kind, entry.data):
            self.put_nowait(entry.text)

    def put_nowait(self, item: str | None) -> None:
        if self.ended.is_set():
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.finish(SlowClient())

    async def put(self, item: str | None, wait: bool) -> None:
        """Queue ``item``; a full queue ends the subscriber at once, or after a wait."""
        if not wait or self.ended.is_set():
            self.put_nowait(item)
            return
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
        # arrives as the put completes, and a disconnected client's task then never ends.
        try:
            async with asyncio.timeout(self.put_timeout_s):
                await self.queue.put(item)
        except TimeoutError:
            self.finish(SlowClient())

    def finish(self, error: BaseException | None = None) -> None:
        """End it: ``error`` None once the end marker is queued. The first call wins."""
        if not self.ended.is_set():
            self.error = error
            self.ended.set()


# (job_id, subscribers, floor: the lowest of their cursors, steps) -> the job is terminal
Check = Callable[[int, list["Subscriber"], Cursor, bool], Awaitable[bool]]


@dataclass
class Hubs:
    """This process's hubs (one set per app and Redis client), by job id."""

    redis: Any
    translate: Callable[[dict[str, Any]], str | None]  # decoded entry -> client JSON; None: from SQL
    check: Check
    block_ms: int  # XREAD wait: a quiet stream re-checks SQL this often
    batch: int  # entries per XREAD
    recheck_s: float  # a busy stream re-checks SQL this often
    ring_size: int = RING_SIZE
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
        self.ring: deque[Entry] = deque(maxlen=hubs.ring_size)
        self.subscribers: dict[Subscriber, None] = {}  # insertion-ordered set
        self.asked = False  # an entry needs the job's row: re-check SQL after this batch
        self.task = asyncio.create_task(self._run(), name=f"stream-hub-{job_id}")

    def attach(self, subscriber: Subscriber) -> bool:
        if subscriber.start < self.floor:
            return False
        for entry in self.ring:  # what the hub read after the subscriber's start
            subscriber.offer(entry)
            # an entry only SQL may send, which the hub's last re-check may have done without it
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
            error = None  # terminal: the check queued every subscriber's end marker
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
        """Read, fan out and re-check until the check finds the job terminal. A quiet stream
        re-checks everything; an entry that needs SQL or a busy stream every ``recheck_s``
        re-checks the row and events."""
        hubs, key = self.hubs, bus.stream_key(self.job_id)
        loop = asyncio.get_running_loop()
        checked_at = loop.time()
        while True:
            position = f"{self.position[0]}-{self.position[1]}"
            reply = await hubs.redis.xread({key: position}, count=hubs.batch, block=hubs.block_ms)
            entries = reply[0][1] if reply else []
            for raw_id, fields in entries:
                entry = self._read(raw_id, fields)
                self.asked = self.asked or entry.text is None
                for subscriber in list(self.subscribers):
                    subscriber.offer(entry)
            if not entries or self.asked or loop.time() - checked_at > hubs.recheck_s:
                self.asked = False  # one raised during the re-check asks for the next one
                if await self._check(steps=not entries):
                    return
                checked_at = loop.time()

    async def _check(self, steps: bool) -> bool:
        subscribers = list(self.subscribers)
        if not subscribers:
            return False
        fields = ("step", "sample_step", "event_id")
        floor = Cursor(*(min(getattr(s.cursor, name) for s in subscribers) for name in fields))
        return await self.hubs.check(self.job_id, subscribers, floor, steps)

    def _read(self, raw_id: bytes | str, fields: dict) -> Entry:
        message = bus.decode(fields)
        entry = Entry(parse_id(raw_id), message["type"], message["data"], self.hubs.translate(message))
        if len(self.ring) == self.ring.maxlen:
            self.floor = self.ring[0].id  # about to drop out: a joiner must start at or after it
        self.ring.append(entry)
        self.position = entry.id
        return entry
