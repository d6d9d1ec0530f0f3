"""Wire schemas (``XRead``); SQL rows never leave the store layer. The request body of
``POST /v1/jobs`` is the :class:`grpo_core.spec.run_spec.JobSpec` itself."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import PurePath
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, computed_field, model_validator

from api.domain.job_labels import DESCRIPTION_DESCRIPTION, TAGS_DESCRIPTION, Description, Tags
from api.domain.lifecycle import JobStatus, actions_for
from api.domain.serve_spec import REFUSED_ACTIONS, SERVE, JobKind
from api.vocabulary import MAX_GPU_HOURS, Priority

T = TypeVar("T")


def as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes (it stores no offset); every stored time is UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


class ErrorInfo(BaseModel):
    code: str
    message: str
    traceback: str | None = None  # the failure's last traceback lines; shown to admins only


class SpecWarningRead(BaseModel):
    """A spec field accepted but ignored, shaped like one of a 422's ``errors``."""

    param: str
    message: str


class HostPlacement(BaseModel):
    worker: str = Field(description="The worker (one host) that holds this part of the job")
    devices: list[int] | None = Field(description="The job's device indices on that worker (null: all of "
                                      "them, for a job dispatched before devices were recorded)")


class AlertBadge(BaseModel):
    rule: str = Field(description="The health rule (GET /v1/codes explains it)")
    action: str = Field(description="What its trip did: notify, pause or stop")
    step: int = Field(description="The step it tripped at (its latest trip)")
    value: float | None = Field(None, description="The figure that tripped it (null: not finite)")


class BestCheckpoint(BaseModel):
    step: int = Field(description="The eval point's step; its checkpoint is kept")
    metric: str = Field(description="grpo.metric_for_best_model, with its eval_ prefix")
    value: float = Field(description="The metric's value there")


class JobRead(BaseModel):
    id: int
    name: str
    kind: JobKind = Field("train", description="`train`: a GRPO run of its spec; `serve`: a serving job, "
                          "which answers `/v1/chat/completions` and `/v1/completions` from the model its "
                          "spec's `serve.model` names until it has been idle a while (the API starts it)")
    tags: list[str] = Field(default_factory=list, description="Its tags, in the order given")
    description: str | None = None
    team_id: int
    status: str
    priority: str
    pool: str
    gpus: int
    attempt: int
    worker_id: str | None
    devices: list[int] | None = None  # its device indices on worker_id, from the last dispatch
    placement: list[HostPlacement] = Field(
        default_factory=list, description="Every worker the job holds devices on, in node-rank order: one "
        "for a job on one worker, several for a job spanning hosts (a gang; the first runs its rendezvous "
        "and reports its steps). Empty while the job holds none.")
    # The run's optimizer steps; null until the worker has counted a file or hub dataset's prompts
    # (a job that trains by epochs, grpo.max_steps -1).
    max_steps: int | None
    last_step: int
    unscored_rows: int = Field(
        0, description="Rows the job's rewards could not score (a grader's exception, a verifier's null), "
        "summed over its `reward_unscored` warning events, which say why. A succeeded job with any is "
        "\"succeeded with warnings\": its reward signal was partly missing.")
    cancel_requested: bool
    preempt_requested: bool = False
    # why a waiting job waits: policy.PENDING_REASONS, or no_scheduler (api.scheduling.liveness);
    # null unless the job waits (queued or preempted)
    pending_reason: str | None = None
    queue_position: int | None = None  # 1-based place in its pool's order, from the scheduler's last pass
    created_at: UtcDatetime
    dispatched_at: UtcDatetime | None
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    heartbeat_at: UtcDatetime | None
    # The newest checkpoint's folder: its server path for admins, its name (``step-40``) for members.
    latest_checkpoint: str | None
    error: ErrorInfo | None
    eval_reward: float | None = Field(None, description=(
        "The mean reward of the job's latest evaluation (its last eval point's `eval_reward`); null for "
        "a job that has not evaluated. Filled in `GET /v1/jobs` and `GET /v1/jobs/{id}`, not in stream "
        "messages"))
    alerts: list[AlertBadge] = Field(
        default_factory=list, description="The health rules that tripped (the latest trip of each, in the "
        "order they first tripped); the job's `alert` events hold every trip and `GET /v1/codes` explains "
        "each rule")
    best: BestCheckpoint | None = Field(
        None, description="The best eval point so far by `grpo.metric_for_best_model`, which has a "
        "checkpoint that retention keeps; null when the job chooses none or has not evaluated yet")
    # A spec may be a megabyte of inline rows: lists leave it out (null) unless asked (include=spec).
    spec: dict[str, Any] | None = None
    # In the answer to a submit or clone only: fields of the request's spec that were accepted but
    # change nothing (a TRL field at a default that asks for nothing). Each is also a
    # `spec_field_ignored` warning event of the job.
    warnings: list[SpecWarningRead] = Field(default_factory=list)

    # Worked out from the status on every dump, so no answer or stream message can carry stale ones.
    @computed_field(description="What may be done to the job now, by its status (`GET /v1/lifecycle` "
                                "has the whole table): a client offers these and no others")
    @property
    def actions(self) -> list[str]:
        actions = actions_for(self.status)
        if self.kind == SERVE:  # nothing to retry, copy or download: it trains no model
            return [action for action in actions if action not in REFUSED_ACTIONS]
        return actions

    @computed_field(description="The status as people read it, which the dashboard and the CLI show: "
                                "`succeeded with warnings` for a success whose rewards left rows unscored "
                                "(`unscored_rows`), else the status itself")
    @property
    def status_label(self) -> str:
        if self.status == JobStatus.SUCCEEDED and self.unscored_rows:
            return "succeeded with warnings"
        return self.status

    def for_member(self) -> JobRead:
        """The job as a team member sees it: the checkpoint's name, not its server path (paths
        tell how the servers are laid out; the name identifies it among the job's checkpoints)."""
        if self.latest_checkpoint is None:
            return self
        return self.model_copy(update={"latest_checkpoint": checkpoint_name(self.latest_checkpoint)})


def checkpoint_name(path: str) -> str:
    return PurePath(path).name


# Event data fields that hold a checkpoint's server path (the trainer's `checkpoint` and
# `resumed` events); members get the checkpoint's name there too.
PATH_FIELDS = ("path", "checkpoint")


def member_event_data(data: dict[str, Any]) -> dict[str, Any]:
    if not any(isinstance(data.get(name), str) for name in PATH_FIELDS):
        return data
    return {name: checkpoint_name(value) if name in PATH_FIELDS and isinstance(value, str) else value
            for name, value in data.items()}


class JobUpdate(BaseModel):
    """``PATCH /v1/jobs/{id}``: the fields given change, the others stay. ``priority`` and
    ``max_gpu_hours`` only until the job finishes; ``tags`` and ``description`` in any status.
    Each changes the job's stored spec too, so a read, the spec and a clone all say the same."""

    model_config = ConfigDict(extra="forbid")
    priority: Priority | None = Field(None, description="The new priority class")
    tags: Tags | None = Field(None, description="The job's tags, replacing all it had. " + TAGS_DESCRIPTION)
    description: Description = Field(None, description="The new description (null clears it). "
                                     + DESCRIPTION_DESCRIPTION)
    max_gpu_hours: float | None = Field(
        None, gt=0, le=MAX_GPU_HOURS, allow_inf_nan=False, description="The job's own GPU-hour budget "
        "(its spec's resources.max_gpu_hours; null removes it), until it finishes: raise it to resume a "
        "job its budget paused")

    @model_validator(mode="after")
    def _changes_something(self) -> JobUpdate:
        if not self.model_fields_set:
            raise ValueError("give priority, tags, description or max_gpu_hours")
        if "priority" in self.model_fields_set and self.priority is None:
            raise ValueError("priority cannot be null")
        if "tags" in self.model_fields_set and self.tags is None:
            raise ValueError("tags cannot be null: [] removes them all")
        return self

    def label_changes(self) -> dict[str, Any]:
        """The tags and description given, by name (an explicit null description included)."""
        given = self.model_fields_set
        return {name: getattr(self, name) for name in ("tags", "description") if name in given}


class CloneDraft(BaseModel):
    """What ``POST /v1/jobs/{id}/clone`` with no changes would queue, to edit first."""

    spec: dict[str, Any] = Field(description="The job's spec, named as its clone would be (NAME-2, ...)")


class EventRead(BaseModel):
    id: int
    job_id: int
    ts: UtcDatetime
    level: str
    type: str
    message: str
    data: dict[str, Any]

    def for_member(self) -> EventRead:
        """A checkpoint's name, not its server path, in ``data`` (see :meth:`JobRead.for_member`)."""
        data = member_event_data(self.data)
        return self if data is self.data else self.model_copy(update={"data": data})


class MetricRead(BaseModel):
    step: int
    ts: UtcDatetime
    values: dict[str, Any]


class SamplesRead(BaseModel):
    step: int
    rows: list[dict[str, Any]]


class CheckpointRead(BaseModel):
    step: int
    path: str = Field(description="The checkpoint's folder: its server path for admins, its name "
                                  "(`step-N`) for members")
    attempt: int | None = Field(None, description="The job's attempt that wrote it (null: recorded "
                                                  "before attempts were)")
    created_at: UtcDatetime


class Page(BaseModel, Generic[T]):
    """A page of items; pass ``next_after`` as ``after`` to get the next one (None: no more)."""

    items: list[T]
    next_after: int | None


class CodesRead(BaseModel):
    """What each code a job may show means, in words (``api.domain.explanations``)."""

    pending_reasons: dict[str, str] = Field(description="A waiting job's `pending_reason` -> why it waits")
    error_codes: dict[str, str] = Field(description="A failed job's `error.code` -> what went wrong")
    alert_rules: dict[str, str] = Field(description="A health rule (a job's `alerts`, its `alert` events, "
                                        "the `error.code` of a job a rule stopped) -> what it watches")


class LifecycleRead(BaseModel):
    """The job lifecycle as a client needs it (``api.domain.lifecycle``): one table that the dashboard
    and the CLI read, so none keeps its own copy of the statuses or of which action applies when."""

    statuses: list[str] = Field(description="Every status a job may have")
    terminal: list[str] = Field(description="The statuses a job ends in; only `retry` leaves one")
    actions: dict[str, list[str]] = Field(description="An action -> the statuses where it applies (a job "
                                                      "read's `actions` are those of its status)")
    priorities: list[str] = Field(description="The priority classes, lowest first")
