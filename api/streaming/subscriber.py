"""One connection's side of the stream: its cursor and its bounded queue of encoded messages.

The queue holds JSON text frames, then :data:`END` once the job's final status is queued. A
full queue ends the subscriber with :class:`SlowClient`, so one slow reader never holds up a
job's other readers.
"""

from __future__ import annotations

import asyncio

from api.streaming.cursor import Cursor, StreamId
from api.streaming.messages import Entry

END = None  # queued after the final status: the sender closes with 1000


class SlowClient(Exception):  # noqa: N818 - names the condition
    """The client's queue is full: it reads slower than the job publishes."""


class Subscriber:
    """A connection's cursor, queue and where its backlog ends."""

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

    async def end(self, wait: bool) -> None:
        """The job is over and its final status queued: queue the end marker and finish."""
        await self.put(END, wait)
        self.finish()

    def finish(self, error: BaseException | None = None) -> None:
        """End it: ``error`` None once the end marker is queued. The first call wins."""
        if not self.ended.is_set():
            self.error = error
            self.ended.set()
