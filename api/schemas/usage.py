"""``GET /v1/usage``'s answer: GPU-seconds each team used per pool over a window (the
arithmetic is :mod:`api.store.usage`'s)."""

from __future__ import annotations

from pydantic import BaseModel

from api.schemas.jobs import UtcDatetime

SECONDS_PER_HOUR = 3600


class UsageItem(BaseModel):
    team: str
    pool: str
    gpu_seconds: float  # the sum over its allocations of GPUs x seconds held inside the window
    gpu_hours: float  # gpu_seconds / 3600


class UsageView(BaseModel):
    since: UtcDatetime  # the window is [since, until)
    until: UtcDatetime
    items: list[UsageItem]  # by team, then pool; only pairs with some use in the window
