"""A job's kept checkpoints as OpenAI's ``fine_tuning.job.checkpoint``: its model source
``job:ID@STEP`` (what a spec's or a create's ``model`` continues from), and the metrics of its
step where the step's record has them, under OpenAI's names (:data:`METRICS`). The whole record
is ``GET /v1/jobs/{id}/metrics``'s."""

from __future__ import annotations

import math
from typing import Any

from api.openai_compat.ids import checkpoint_ref, job_ref
from api.openai_compat.job_object import unix
from api.schemas.fine_tuning import FineTuningJobCheckpoint
from api.schemas.jobs import CheckpointRead

# OpenAI's name -> the step record's (docs/architecture.md §5).
METRICS = {"train_loss": "loss", "train_reward_mean": "reward", "valid_reward_mean": "eval_reward"}


def checkpoint_model(job_id: int, step: int) -> str:
    return f"job:{job_id}@{step}"


def job_checkpoint(job_id: int, checkpoint: CheckpointRead,
                   record: dict[str, Any] | None) -> FineTuningJobCheckpoint:
    """``record``: the step's metrics (None: the job has no record of that step)."""
    metrics: dict[str, float | None] = {"step": float(checkpoint.step)}
    for name, ours in METRICS.items():
        value = (record or {}).get(ours)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            metrics[name] = float(value)
    return FineTuningJobCheckpoint(id=checkpoint_ref(job_id, checkpoint.step),
                                   created_at=unix(checkpoint.created_at),
                                   fine_tuned_model_checkpoint=checkpoint_model(job_id, checkpoint.step),
                                   fine_tuning_job_id=job_ref(job_id), step_number=checkpoint.step,
                                   metrics=metrics)
