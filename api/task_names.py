"""Celery task names and queues, shared by the scheduler (which sends by name) and the worker
(which registers them). The API side never imports task modules."""

from __future__ import annotations

RUN_JOB = "grpo.run_job"


def pool_queue(pool: str) -> str:
    """One Celery queue per GPU pool."""
    return f"grpo.pool.{pool}"
