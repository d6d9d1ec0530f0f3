"""A job as OpenAI's ``fine_tuning.job`` object, whichever door it came in by.

Its status is told in OpenAI's words (:data:`STATUSES`): a job waiting for GPUs is ``queued``
however it came to wait (submitted, dispatched but not yet claimed, preempted, requeued after a
fault); one asked to stop at its next step already shows where it is going (``cancelling`` is
``cancelled``, ``pausing`` is ``paused``) while ``finished_at`` stays null until it has stopped.
Files are checked at upload and at create, before the job exists, so no job is ever
``validating_files``. Its ``fine_tuned_model`` once succeeded is ``job:ID``, a model source of
specs (and of another create's ``model``); ``hyperparameters`` are the ones it trains with,
resolved from its spec; ``method`` is the one sent, or for a job submitted at ``/v1/jobs`` a
reinforcement method without an OpenAI grader (its rewards are in its spec)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from api.domain.lifecycle import JobStatus
from api.openai_compat.ids import job_ref
from api.openai_compat.job_request import BASE_GENERATIONS, BASE_LEARNING_RATE
from api.schemas.fine_tuning import (
    FineTuningHyperparameters,
    FineTuningJob,
    FineTuningJobError,
    FineTuningJobFacts,
    OpenAIStatus,
)
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.sources import FILE_SCHEME

S = JobStatus
STATUSES: dict[str, OpenAIStatus] = {
    S.QUEUED: "queued",
    S.DISPATCHED: "queued",
    S.PREEMPTED: "queued",
    S.RUNNING: "running",
    S.CANCELLING: "cancelled",
    S.PAUSING: "paused",
    S.PAUSED: "paused",
    S.SUCCEEDED: "succeeded",
    S.FAILED: "failed",
    S.CANCELLED: "cancelled",
}
del S
# A job whose dataset is inline rows (submitted at /v1/jobs) names no file.
INLINE = "inline"
_GRPO_DEFAULTS = GRPOConfig().model_dump(mode="json")


def unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def fine_tuned_model(job_id: int) -> str:
    """The model source a succeeded job's model goes by."""
    return f"job:{job_id}"


def fine_tuning_job(facts: FineTuningJobFacts) -> FineTuningJob:
    job, spec, request = facts.job, facts.spec, facts.openai_request or {}
    grpo = {**_GRPO_DEFAULTS, **(spec.get("grpo") or {})}
    resolved = hyperparameters(grpo)
    method = request.get("method") or {"type": "reinforcement", "reinforcement": {
        "grader": None, "hyperparameters": resolved.model_dump(mode="json")}}
    error = None if job.error is None else FineTuningJobError(code=job.error.code, message=job.error.message)
    eval_dataset = spec.get("eval_dataset")
    return FineTuningJob(
        id=job_ref(job.id),
        created_at=unix(job.created_at),
        finished_at=unix(job.finished_at),
        model=(spec.get("model") or {}).get("source") or "",
        fine_tuned_model=fine_tuned_model(job.id) if job.status == JobStatus.SUCCEEDED else None,
        organization_id=facts.organization,
        status=STATUSES[job.status],
        training_file=file_named((spec.get("dataset") or {}).get("source")),
        validation_file=None if eval_dataset is None else file_named(eval_dataset.get("source")),
        result_files=[],
        trained_tokens=facts.trained_tokens,
        error=error,
        seed=grpo["seed"],
        suffix=job.name,
        user_provided_suffix=request.get("suffix"),
        metadata=request.get("metadata"),
        method=method,
        hyperparameters=resolved,
    )


def file_named(source: str | None) -> str:
    """What a dataset's source is as OpenAI's ``training_file``: an upload's id (``file:ID`` ->
    ID), another source as it is (``path:``, ``hf:``), ``inline`` for inline rows."""
    if source is None:
        return INLINE
    scheme, _, location = source.partition(":")
    return location.strip() if scheme == FILE_SCHEME else source


def hyperparameters(grpo: dict[str, Any]) -> FineTuningHyperparameters:
    """OpenAI's hyperparameters a ``grpo:`` section amounts to (the inverse of the create's)."""
    by_epochs = grpo["max_steps"] == -1
    evaluated = grpo.get("eval_strategy") == "steps" and grpo.get("eval_steps") is not None
    return FineTuningHyperparameters(
        n_epochs=_whole_if_whole(grpo["num_train_epochs"]) if by_epochs else None,
        batch_size=grpo["prompts_per_step"],
        learning_rate_multiplier=_ratio(grpo["learning_rate"], BASE_LEARNING_RATE),
        eval_interval=_whole_if_whole(grpo["eval_steps"]) if evaluated else None,
        eval_samples=grpo.get("eval_num_generations", 1),
        compute_multiplier=_ratio(grpo["num_generations"], BASE_GENERATIONS),
    )


def _ratio(value: float, base: float) -> float:
    return float(f"{value / base:.12g}")  # 3e-6 / 1e-6 is 3, not 2.9999999999999996


def _whole_if_whole(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
