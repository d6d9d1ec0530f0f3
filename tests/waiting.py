"""Waiting in tests: poll a condition until it holds or a deadline passes.

A test never sleeps a fixed time to let something happen: a fixed sleep is too short on a busy
machine and wasted on an idle one, and it hides what the test is waiting for. It names the
condition instead; a timeout fails with that name and, through ``details``, whatever explains
it (a service log, the last value read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05,
               details: Callable[[], str] | None = None) -> T:
    """The predicate's first truthy value; AssertionError naming ``what`` after ``timeout`` s.

    The predicate is asked once more at the deadline, so a slow predicate is never cut short."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    extra = details() if details is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"\n{extra}" if extra else ""))


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie its parent has not reaped yet counts): a
    predicate to wait on."""
    import psutil  # only the tests that watch processes need it

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def is_rank(process) -> bool:
    """Whether a psutil process is a training rank (named so by grpo_core.run.launch), not the
    stand-in torch's launcher started for it nor the rank server it was forked from."""
    import psutil

    try:
        return process.name().startswith("grpo-rank-")
    except psutil.NoSuchProcess:
        return False
