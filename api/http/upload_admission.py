"""What an upload (``POST /v1/files``) may hold of an API process, whichever team sends it: one of
the process's ``GRPO_MAX_UPLOADS_IN_FLIGHT`` places (:class:`UploadsInFlight`), and its place only
while its body keeps coming at ``GRPO_UPLOAD_MIN_BYTES_PER_SECOND`` (:class:`UploadPace`).

The per-team slots (:mod:`api.store.upload_slots`) keep one team from taking every place; these
keep all teams together within what one process's spool disk and event loop carry, and keep a
client that trickles a byte at a time (or sends nothing more) from holding a place and a slot
for ever. A full process answers 503 ``unavailable`` with Retry-After: the service's condition,
not the caller's overuse (that is the per-team 429), and another API process behind the same
balancer may have room. A body that falls behind its pace is a 408 ``upload_too_slow``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from api.domain.errors import TooSlow, Unavailable

RETRY_AFTER_SECONDS = 5


class UploadsInFlight:
    """A process's uploads in flight (on ``app.state``; used from the event loop only)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    @contextmanager
    def held(self) -> Iterator[None]:
        if self.count >= self.limit:
            raise Unavailable(f"this API process already receives {self.limit} uploads, the most it takes at "
                              f"once (GRPO_MAX_UPLOADS_IN_FLIGHT); retry in {RETRY_AFTER_SECONDS} s",
                              retry_after=RETRY_AFTER_SECONDS, param="file")
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1


class UploadPace:
    """The least an upload's body must have delivered by now: ``min_rate`` bytes a second, after
    ``grace`` seconds it may be behind by (a connection's start, a client's pause). So a body of
    any size may take as long as its size needs at that rate, and no longer."""

    def __init__(self, min_rate: float, grace: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_rate, self.grace, self.clock = min_rate, grace, clock
        self.started = clock()
        self.received = 0  # bytes of the body so far

    def seconds_left(self) -> float:
        """How long the next bytes may take to arrive."""
        return self.started + self.grace + self.received / self.min_rate - self.clock()

    def too_slow(self) -> TooSlow:
        return TooSlow(f"the upload arrived slower than {self.min_rate:g} bytes a second (after a "
                       f"{self.grace:g} s start; GRPO_UPLOAD_MIN_BYTES_PER_SECOND): {self.received} bytes in "
                       f"{self.clock() - self.started:.0f} s; nothing was kept", param="file")
