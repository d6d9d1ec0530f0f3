"""The live stream's tunables: queue and batch sizes, and how often SQL is re-read as a safety net."""

from __future__ import annotations

from dataclasses import dataclass

from api.settings import Settings


@dataclass(frozen=True)
class StreamConfig:
    queue_size: int = 256  # messages a client may fall behind before it is cut off (1013)
    # Writers publish every event and status change, so SQL re-reads only catch what a failed
    # publish lost: a quiet stream re-reads everything after each XREAD wait, a busy one re-reads
    # the job's row and events every ``recheck_s``.
    block_ms: int = 1000
    recheck_s: float = 5.0
    ring_size: int = 512  # recent entries a late joiner may replay
    # The first backlog waits this long for room in the queue; nothing after it waits at all.
    backlog_put_timeout_s: float = 30.0

    @property
    def batch(self) -> int:
        """Entries per XREAD: one batch never fills the queue of a client that keeps up."""
        return self.queue_size // 2

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamConfig:
        return cls(block_ms=round(settings.stream_block_seconds * 1000),
                   recheck_s=settings.stream_recheck_seconds)
