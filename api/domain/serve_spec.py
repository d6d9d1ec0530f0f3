"""``ServeSpec``: the spec of a *serving job*, the job that holds a device to answer OpenAI's
``/v1/chat/completions`` and ``/v1/completions`` from one model of a team's job.

A serving job is a job row like any other (``jobs.kind = 'serve'``), so the scheduler places it,
its GPU time is the team's usage, its quota and fair share count it and a higher-priority job may
preempt it; only what it runs differs: no training, a model loaded and requests answered until it
has been idle for ``serve.idle_seconds`` (then it ends ``succeeded``). The API makes one per team
and model source when a chat request finds none (:mod:`api.store.serving`); nobody submits one.

Its spec says which model it serves and little else: ``serve.model`` is a ``job:ID`` or
``job:ID@STEP`` source (a job's ``fine_tuned_model``, or one of its checkpoints), resolved by the
worker as a training job's ``job:`` source is. Pure: no torch, no framework.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.domain.errors import Conflict
from api.domain.job_spec import JOB_SCHEME, continued_job
from api.vocabulary import DEFAULT_POOL, POOL_NAME_PATTERN, Priority

TRAIN, SERVE = "train", "serve"
JOB_KINDS = (TRAIN, SERVE)
JobKind = Literal["train", "serve"]
MAX_SERVE_BATCH = 256
MAX_IDLE_SECONDS = 7 * 24 * 3600
# A serving job in these statuses is the one its team's requests for its model go to (and wait
# for): at most one per team and model (the unique index ``uq_jobs_serving``). One stopping
# (cancelling, pausing), resting or ended is replaced by a new one at the next request.
LIVE_SERVING_STATUSES = ("queued", "dispatched", "running", "preempted")
# Actions a serving job never offers: it has no spec to train again or copy, and no model of its own.
REFUSED_ACTIONS = frozenset({"retry", "clone", "download_model"})


def served_job(model: str) -> tuple[int, int | None]:
    """``(job id, step or None)`` of a ``job:ID[@STEP]`` model; ValueError for anything else,
    with a message naming what is accepted."""
    try:
        named = continued_job(model)
    except ValueError as exc:
        raise ValueError(f"'{model}' is no job:ID[@STEP] model: {exc}") from None
    if named is None:
        raise ValueError(f"'{model}' is no model of this service: name a job's model as job:ID "
                         "(its fine_tuned_model) or a checkpoint of it as job:ID@STEP")
    return named


def canonical_model(model: str) -> str:
    """``job:7`` / ``job:7@40`` however it was written (``job: 07``): one serving job per model."""
    job_id, step = served_job(model)
    return f"{JOB_SCHEME}:{job_id}" + ("" if step is None else f"@{step}")


def serving_name(model: str) -> str:
    """The serving job's name: ``serve-job-7`` or ``serve-job-7-step-40``."""
    job_id, step = served_job(model)
    return f"serve-job-{job_id}" + ("" if step is None else f"-step-{step}")


class ServeConfig(BaseModel):
    """What the serving job serves and how long it stays loaded without a request."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(..., max_length=64, description="job:ID (a job's final model, else its newest "
                       "checkpoint) or job:ID@STEP (that checkpoint)")
    idle_seconds: int = Field(..., ge=1, le=MAX_IDLE_SECONDS, description="The job ends (succeeded, its "
                              "model unloaded) after this long without a request: the team's "
                              "`serve_idle_seconds` when it was started")
    max_batch: int = Field(8, ge=1, le=MAX_SERVE_BATCH, description="Requests generated together")

    @field_validator("model")
    @classmethod
    def _job_model(cls, value: str) -> str:
        return canonical_model(value)


class ServeResources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: str = Field(DEFAULT_POOL, pattern=POOL_NAME_PATTERN, description="The pool of workers to serve on")
    gpus: Literal[1] = Field(1, description="A serving job holds one device")


class ServeSpec(BaseModel):
    """A serving job's spec, as stored in ``jobs.spec``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=128)
    serve: ServeConfig
    resources: ServeResources = Field(default_factory=ServeResources)
    priority: Priority = Field("low", description="The scheduler's class; low by default, so training "
                               "goes first and may preempt it")


def is_serving(spec: dict[str, Any] | None) -> bool:
    """Whether a stored spec is a serving job's (for readers that have the spec, not the row)."""
    return isinstance(spec, dict) and isinstance(spec.get("serve"), dict)


def refuse_for_serving(kind: str, job_id: int, action: str) -> None:
    """:class:`~api.domain.errors.Conflict` for ``action`` (retry, clone) of a serving job: it has no
    training spec; the next chat request starts a new one."""
    if kind == SERVE:
        raise Conflict(f"job {job_id} is a serving job: there is nothing to {action} (the next chat request "
                       "to its model starts a new one)", param="job_id")
