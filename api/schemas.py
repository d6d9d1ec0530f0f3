"""Wire schemas (``XRead``); SQL rows never leave the store layer. The request body of
``POST /v1/jobs`` is the :class:`grpo_core.spec.JobSpec` itself."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class ErrorInfo(BaseModel):
    code: str
    message: str


class JobRead(BaseModel):
    id: int
    name: str
    team_id: int
    status: str
    priority: str
    pool: str
    gpus: int
    attempt: int
    worker_id: str | None
    max_steps: int
    last_step: int
    cancel_requested: bool
    created_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    latest_checkpoint: str | None
    error: ErrorInfo | None
    spec: dict[str, Any]


class EventRead(BaseModel):
    id: int
    job_id: int
    ts: datetime
    level: str
    type: str
    message: str
    data: dict[str, Any]


class MetricRead(BaseModel):
    step: int
    ts: datetime
    values: dict[str, Any]


class SamplesRead(BaseModel):
    step: int
    rows: list[dict[str, Any]]


class CheckpointRead(BaseModel):
    step: int
    path: str
    created_at: datetime


class Page(BaseModel, Generic[T]):
    """A page of items; pass ``next_after`` as ``after`` to get the next one (None: no more)."""

    items: list[T]
    next_after: int | None
