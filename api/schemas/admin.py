"""Wire schemas of teams, API keys and pools (``/v1/admin``, ``/v1/me``).

Request bodies forbid unknown fields, so a misspelt field is an error rather than a silent no-op.
The store checks the same limits again (its other caller is the CLI), from ``api.vocabulary``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.jobs import UtcDatetime
from api.vocabulary import (
    MAX_ARTIFACT_QUOTA_BYTES,
    MAX_GPU_HOURS,
    MAX_LABEL_LENGTH,
    MAX_QUEUED_JOBS,
    MAX_QUOTA_GPUS,
    MAX_RATE_PER_SECOND,
    NAME_PATTERN,
    BudgetPeriod,
    Priority,
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeamLimits(_Body):
    """An admin's overrides of what a team's members may do; a null field means the deployment's
    default (the ``GRPO_TEAM_*`` settings). Admin keys are held to none of them but
    ``max_queued_jobs`` and the GPU-hour budget, which bound the team's queue and spending whoever
    fills it."""

    max_priority: Priority | None = Field(
        None, description="Highest priority class the team's members may give a job (submit, clone, "
        "retry, resume, PATCH); a higher one is a 422 naming `priority`")
    max_queued_jobs: int | None = Field(
        None, ge=0, le=MAX_QUEUED_JOBS, description="Most of the team's jobs waiting in the queue "
        "(queued or preempted) at once; a submit, clone, retry or resume past it is a 409 `queue_full`")
    reads_per_second: float | None = Field(
        None, gt=0, le=MAX_RATE_PER_SECOND, allow_inf_nan=False,
        description="Token-bucket refill rate of the team's reads (GET, and opening a stream)")
    read_burst: int | None = Field(None, ge=1, le=MAX_QUEUED_JOBS,
                                   description="Reads the bucket holds: how many may come at once")
    writes_per_second: float | None = Field(
        None, gt=0, le=MAX_RATE_PER_SECOND, allow_inf_nan=False,
        description="Token-bucket refill rate of the team's writes (POST, PATCH, PUT, DELETE)")
    write_burst: int | None = Field(None, ge=1, le=MAX_QUEUED_JOBS,
                                    description="Writes the bucket holds: how many may come at once")
    serve_idle_seconds: int | None = Field(
        None, ge=1, le=7 * 24 * 3600, description="How long the team's serving job (chat with a job's "
        "model) stays loaded without a request before it ends and frees its device")
    gpu_hours_budget: float | None = Field(
        None, ge=0, le=MAX_GPU_HOURS, allow_inf_nan=False, description="GPU-hours the team's jobs may "
        "use in each budget_period (GPUs × hours held, all pools); reached, its running and waiting jobs "
        "are paused and a submit, clone, retry or resume is a 422 `budget_exhausted` naming "
        "`team.gpu_hours_budget` until the next period or a higher budget")
    budget_period: BudgetPeriod | None = Field(
        None, description="The calendar period (UTC) gpu_hours_budget renews each: day (from 00:00), "
                          "week (from Monday) or month (from the 1st)")


class TeamRead(BaseModel):
    id: int
    name: str
    weight: float
    quotas: dict[str, int] = Field(description="pool -> most GPUs the team may hold there at once")
    artifact_quota_bytes: int | None = Field(
        None, description="most bytes the team's jobs' checkpoints may occupy (null: no limit)")
    limits: TeamLimits = Field(default_factory=TeamLimits,
                               description="Overrides set by admins; null fields are the defaults")
    created_at: UtcDatetime


class TeamCreate(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="Fair-share weight")


class TeamUpdate(_Body):
    weight: float = Field(gt=0, allow_inf_nan=False)


class QuotaSet(_Body):
    gpus: int = Field(ge=0, le=MAX_QUOTA_GPUS)


class QuotaChange(_Body):
    delta: int = Field(ge=-MAX_QUOTA_GPUS, le=MAX_QUOTA_GPUS,
                       description="Added to the current quota (none counts as 0); the result must be >= 0")


class ArtifactQuotaSet(_Body):
    bytes: int = Field(ge=0, le=MAX_ARTIFACT_QUOTA_BYTES,
                       description="Most bytes the team's jobs' artifacts and uploaded files may occupy "
                                   "(checked before each checkpoint and each upload)")


class KeyCreate(_Body):
    admin: bool = False
    # Printable text only: a NUL cannot be stored, and a label is printed in terminals.
    label: str | None = Field(None, max_length=MAX_LABEL_LENGTH, pattern=r"^[^\x00-\x1f\x7f]*$")


class KeyRead(BaseModel):
    id: int
    team: str
    prefix: str = Field(description="The key's first characters, to tell keys apart")
    is_admin: bool
    label: str | None
    created_at: UtcDatetime
    revoked_at: UtcDatetime | None


class KeyCreated(KeyRead):
    key: str = Field(description="The key itself; shown this once, only its hash is kept")


class PoolCreate(_Body):
    name: str = Field(pattern=NAME_PATTERN)


class PoolLimits(_Body):
    """An admin's overrides of a pool's limits; a null field means the deployment's default
    (the ``GRPO_POOL_*`` settings). Submissions over a limit are refused with a 422 naming the field."""

    max_tokens_per_step: int | None = Field(
        None, ge=1, le=2**53, description="prompts_per_step × num_generations × (max_prompt_length + "
        "max_completion_length); an eval point's inline eval prompts × eval_num_generations × the same "
        "lengths too")
    max_steps: int | None = Field(None, ge=1, le=10_000_000)
    max_checkpoints_per_job: int | None = Field(None, ge=1, le=10_000_000,
                                                description="max_steps / checkpoint_every, rounded up")
    max_inline_dataset_bytes: int | None = Field(
        None, ge=1, le=2**40, description="dataset.prompts and eval_dataset.prompts together, as JSON")
    max_sandbox_memory_bytes: int | None = Field(
        None, ge=1, le=2**50, description="Memory the sandboxes of a job's rewards (code_tests, python) may "
        "hold at once: the largest reward's memory_mb × max_processes (+ 16 MiB of /tmp) × parallel, "
        "on each of resources.gpus ranks")
    job_memory_bytes: int | None = Field(
        None, ge=64 * 2**20, le=2**50, description="Memory a job's processes may use together; beyond it "
        "they are killed and the job fails `out_of_memory` (default: a share of the worker's memory)")


class PoolRead(BaseModel):
    name: str
    held: bool = Field(description="No job is dispatched into a held pool")
    max_worker_gpus: int | None = Field(description="Largest GPU count a live worker advertised: the most a "
                                        "job gets on one host")
    total_gpus: int | None = Field(None, description="The GPUs of all the pool's live workers together, "
                                   "when the scheduler last saw them change: the most a job may ask for (one "
                                   "larger than max_worker_gpus runs across several workers)")
    limits: PoolLimits = Field(description="Overrides set by admins; null fields are the defaults")
    created_at: UtcDatetime


class Me(BaseModel):
    team: str
    team_id: int
    is_admin: bool
    key_prefix: str | None = Field(description="None for the operator token and with auth off")
    artifact_bytes: int = Field(description=(
        "Bytes counted against the team's artifact quota: job_artifact_bytes + file_bytes"))
    job_artifact_bytes: int = Field(description=(
        "Bytes the team's job artifacts (checkpoints, final models, tracker files) take in storage; "
        "deleting finished jobs (DELETE /v1/jobs/{id}) frees them"))
    file_bytes: int = Field(description=(
        "Bytes of the team's uploaded files (POST /v1/files); deleting them (DELETE /v1/files/{id}) "
        "frees them"))
    artifact_quota_bytes: int | None = Field(description=(
        "The most artifact bytes the team may hold (null: no limit); a checkpoint that would go over "
        "it fails its job artifact_quota_exceeded, an upload is refused with that code"))
