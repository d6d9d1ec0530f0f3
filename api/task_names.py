"""Celery task names and queues, shared by the scheduler (which sends by name) and the worker
(which registers them). The API side never imports task modules."""

from __future__ import annotations

RUN_JOB = "grpo.run_job"


def worker_queue(worker_id: str) -> str:
    """Each worker consumes a queue of its own: the scheduler places a job on one worker (the
    one whose GPUs it counted), so the broker must not pick another one of the pool."""
    return f"grpo.worker.{worker_id}"
