"""SQL tables (SQLAlchemy 2, typed). Only the store layer (``api/store``) touches these rows.

Schema changes go through Alembic revisions under ``migrations/``; nothing here creates tables.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from api.domain.lifecycle import JOB_STATUSES
from api.domain.serve_spec import JOB_KINDS, LIVE_SERVING_STATUSES
from api.vocabulary import PRIORITIES

# Deterministic constraint names so Alembic revisions are reproducible on every database.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT ids on Postgres, INTEGER on SQLite (its only auto-increment type).
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Team(Base):
    __tablename__ = "teams"
    __table_args__ = (CheckConstraint("weight > 0", name="weight_positive"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    # The most bytes the team's checkpoints may occupy under the artifacts root (None: no limit).
    artifact_quota_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Admins' overrides of what its members may do (api.schemas.admin.TeamLimits; None or a
    # missing field: the deployment's default).
    limits: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Pool(Base):
    """A named set of workers. Workers register their pool; ``max_worker_gpus`` is the largest
    GPU count a live worker of the pool advertised when the scheduler last saw one (None: never),
    which is what a submission is checked against. ``held`` stops dispatch into the pool.
    ``limits``: the admins' overrides of the deployment's per-pool limits
    (:class:`api.schemas.admin.PoolLimits`; None or a missing field: the default)."""

    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    max_worker_gpus: Mapped[int | None] = mapped_column(Integer)
    # The GPUs of all its live workers together (None: never seen), the most a gang may ask for.
    total_gpus: Mapped[int | None] = mapped_column(Integer)
    limits: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Verifier(Base):
    """A verifier service admins registered, by name, for ``http_verifier`` rewards of one team's
    jobs or of one pool's (exactly one of ``team_id`` and ``pool``). ``auth_secret`` is sent as
    the value of the ``auth_header`` header and never shown again (the API says only that it is
    set). Limits: one request's ``timeout_seconds``, ``max_concurrency`` requests in flight per job
    process, ``max_batch_size`` rows per request."""

    __tablename__ = "verifiers"
    __table_args__ = (
        CheckConstraint("(team_id IS NULL) <> (pool IS NULL)", name="one_scope"),
        CheckConstraint("timeout_seconds > 0", name="timeout_positive"),
        CheckConstraint("max_concurrency >= 1 AND max_batch_size >= 1", name="limits_positive"),
    )

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    pool: Mapped[str | None] = mapped_column(ForeignKey("pools.name", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    auth_header: Mapped[str | None] = mapped_column(String(128))
    auth_secret: Mapped[str | None] = mapped_column(Text)
    timeout_seconds: Mapped[float] = mapped_column(Float)
    max_concurrency: Mapped[int] = mapped_column(Integer)
    max_batch_size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TeamQuota(Base):
    """The most GPUs a team may hold at once in a pool. No row: no limit beyond capacity."""

    __tablename__ = "team_quotas"
    __table_args__ = (
        UniqueConstraint("team_id", "pool", name="uq_team_quotas_team_id_pool"),
        CheckConstraint("gpus >= 0", name="gpus_not_negative"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    pool: Mapped[str] = mapped_column(ForeignKey("pools.name", ondelete="CASCADE"))
    gpus: Mapped[int] = mapped_column(Integer)


class Allocation(Base):
    """One stretch of GPUs held by a job: opened at dispatch, closed when the job stops holding
    them. The fair-share usage of a team is computed from these (decayed by a half-life), so it
    needs no periodic bookkeeping and survives scheduler restarts."""

    __tablename__ = "allocations"
    # By team too: each scheduler pass sums the period's allocations of every team with a GPU-hour
    # budget (api.store.budgets), which must not read the whole history.
    __table_args__ = (Index("ix_allocations_pool_ended_at", "pool", "ended_at"),
                      Index("ix_allocations_team_id_ended_at", "team_id", "ended_at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    pool: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    label: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# The statuses in which a serving job is the one its team's requests for its model go to.
_LIVE_SERVING = text(f"kind = 'serve' AND status IN {LIVE_SERVING_STATUSES}")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(f"status IN {JOB_STATUSES}", name="status"),
        CheckConstraint(f"priority IN {PRIORITIES}", name="priority"),
        UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_id_idempotency_key"),
        Index("ix_jobs_status_pool", "status", "pool"),
        CheckConstraint(f"kind IN {JOB_KINDS}", name="kind"),
        # One live serving job per team and model: two first chat requests at once make one.
        Index("uq_jobs_serving", "team_id", "serve_model", unique=True,
              postgresql_where=_LIVE_SERVING, sqlite_where=_LIVE_SERVING),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # 'train': a GRPO run of a JobSpec; 'serve': a serving job of a ServeSpec (api.domain.serve_spec),
    # which answers chat requests from a job's model until it has been idle for a while.
    kind: Mapped[str] = mapped_column(String(8), default="train", server_default="train")
    # A serving job's model (``job:ID[@STEP]``, canonical, api.domain.serve_spec.canonical_model);
    # null for training jobs.
    serve_model: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    priority: Mapped[str] = mapped_column(String(8), default="normal")
    pool: Mapped[str] = mapped_column(String(64), default="default")
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    # Null until known: a job by epochs over a file or hub dataset is counted by its worker.
    max_steps: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # ``attempt`` when the job was last retried by hand: the attempt limit counts from here.
    attempt_base: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How many times the job was dispatched: each dispatch's message carries its number, and a
    # claim (or a gang host's join) of any other dispatch is refused (a late or stale delivery).
    dispatches: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worker_id: Mapped[str | None] = mapped_column(String(128))
    # Indices of the worker's devices the job runs on (api.scheduling.policy.Dispatch.devices).
    devices: Mapped[list[Any] | None] = mapped_column(JSON)
    # Every host of the dispatch in node-rank order, ``[{"worker": id, "devices": [...]}]``: one for
    # a job on one worker (the same as worker_id and devices), several for a gang. Set with the
    # dispatch, cleared with worker_id when the job is released.
    placement: Mapped[list[Any] | None] = mapped_column(JSON)
    # What a worker must advertise to run it (its rewards' needs, sorted; null: nothing), computed
    # at submit so that the scheduler places by it without reading specs.
    required_capabilities: Mapped[list[Any] | None] = mapped_column(JSON)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Requeued after a fault: not dispatched before this (the database's clock; None: now).
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    preempt_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    pending_reason: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_step: Mapped[int] = mapped_column(Integer, default=0)
    # Rows its rewards left unscored, summed over its reward_unscored warnings (a step trained
    # again after a resume counts again): non-zero, a success is "succeeded with warnings".
    unscored_rows: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    latest_checkpoint: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_traceback: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # The spec's tags in their order, for reads (null: none); ``job_tags`` holds the same tags, one a
    # row, for the list's filter. Both are written together (api.store.job_labels), as is the spec.
    tags: Mapped[list[Any] | None] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text)
    # Set when the team deleted the job (api.store.job_deletion): the row is a tombstone that
    # every read hides, kept for its allocations (GPU-hours) and webhook deliveries.
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A job made through OpenAI's fine-tuning API (api.openai_compat): what its create carried that
    # the spec does not hold, ``{"method", "metadata", "suffix"}`` as sent; NULL for our own submits.
    openai_request: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The spec's resources.max_gpu_hours (null: no budget of its own), kept beside it so the
    # scheduler's budget pass reads no spec; PATCH changes both (api.store.jobs.set_max_gpu_hours).
    max_gpu_hours: Mapped[float | None] = mapped_column(Float)
    # The health rules that tripped, the latest trip of each (grpo_core.run.health), for the badge on
    # the job and the jobs list; null: none. The events hold every trip.
    alerts: Mapped[list[Any] | None] = mapped_column(JSON)
    # The best eval point by grpo.metric_for_best_model, ``{"step", "metric", "value"}``; null: none yet.
    best: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class JobHost(Base):
    """One host of a job that spans hosts (a gang), for the length of one dispatch: its node rank
    (0 is ``jobs.worker_id``), when its worker joined the attempt and last renewed that host's lease,
    and when its part of the attempt ended cleanly. Node 0's lease is the job's own
    (``jobs.heartbeat_at``); node 0 alone writes ``rendezvous``, the ``host:port`` the gang's ranks
    meet at, once it has picked the port. The rows go when the job leaves its holding statuses."""

    __tablename__ = "job_hosts"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(128))
    joined_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    rendezvous: Mapped[str | None] = mapped_column(String(300))


class JobTag(Base):
    """One tag of a job, for ``GET /v1/jobs?tag=``: an indexed equality on every database, where a
    JSON column would need a dialect's JSON operators or a fragile LIKE over its text."""

    __tablename__ = "job_tags"
    __table_args__ = (Index("ix_job_tags_tag_job_id", "tag", "job_id"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    level: Mapped[str] = mapped_column(String(8), default="info")
    type: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class JobMetric(Base):
    __tablename__ = "job_metrics"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_job_metrics_job_id_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    # The attempt that wrote it: a later attempt that trains the step again replaces the record.
    attempt: Mapped[int | None] = mapped_column(Integer)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class JobSample(Base):
    __tablename__ = "job_samples"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_job_samples_job_id_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    rows: Mapped[list[Any]] = mapped_column(JSON)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_id_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    # The attempt that stored it: its object-store key (api.artifacts.paths.checkpoint_key). NULL
    # for rows written before attempts were recorded, stored under the plain name.
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Webhook(Base):
    """A team's notification endpoint (``POST /v1/webhooks``): ``events`` it wants
    (:data:`api.schemas.webhooks.WEBHOOK_EVENTS`), POSTed to ``url`` and signed with ``secret``.
    The secret is stored sealed under the operator's key (:mod:`api.security.secret_box`), since signing
    needs it; the API shows it only in the answer that creates it.
    Deleting a webhook deletes its deliveries, pending ones included."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[Any]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookDelivery(Base):
    """One event owed to one webhook: the outbox row a job's transition writes in its own
    transaction, then the record of sending it (``pending`` until a 2xx answer, ``failed`` once
    its attempts ran out). ``next_attempt_at`` (the database's clock) is when a sender may take it
    next: a sender that took it pushes it past its request's timeout, so a sender that died
    mid-request leaves it to be sent again (at least once)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status"),
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    # An error class only (api.scheduling.webhook_sender.ERROR_CLASSES): never a receiver's words.
    last_error: Mapped[str | None] = mapped_column(Text)
    last_duration_ms: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


FILE_PURPOSES = ("dataset", "model")
# uploading: its row is written before its object, so an object in the store always has a row (a
# crashed upload leaves one the team can see and delete); ready: stored and checked, immutable
# from here; error: its object could not be stored.
FILE_STATUSES = ("uploading", "ready", "error")


class UploadedFile(Base):
    """A team's upload (``POST /v1/files``): a dataset file or a model archive, checked on upload.
    Its bytes live in the object store under ``files/{id}`` (:func:`api.storage.keys.file_key`),
    never rewritten once ``ready``; a worker checks them against ``sha256``."""

    __tablename__ = "files"
    __table_args__ = (
        CheckConstraint(f"purpose IN {FILE_PURPOSES}", name="purpose"),
        CheckConstraint(f"status IN {FILE_STATUSES}", name="status"),
        Index("ix_files_team_id_created_at", "team_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(16))
    filename: Mapped[str] = mapped_column(String(255))
    # How its bytes read: jsonl, json, csv or parquet (a dataset), tar (a model, gzipped or not).
    format: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger)
    # A model archive's files unpacked (what a worker's copy takes and the quota counts); NULL: a
    # dataset, or an archive uploaded before this was recorded: it counts as uploaded.
    unpacked_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # A dataset's columns (every one some row has, in the order first seen) and the prompt field
    # its rows were checked with, for the submit checks of the specs that name it. NULL: a model;
    # a dataset uploaded before they were recorded; columns too many to record
    # (grpo_core.io.prompt_data.MAX_RECORDED_COLUMNS). Specs naming it are then checked on the worker.
    columns: Mapped[list[Any] | None] = mapped_column(JSON)
    prompt_field: Mapped[str | None] = mapped_column(String(128))
    # A dataset's row count, for the submit's warning of a round drawing more prompts than it has.
    # NULL: a model, or a dataset uploaded before it was recorded (its worker warns instead).
    rows: Mapped[int | None] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="uploading")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The OpenAI purpose the upload named (``fine-tune``: a dataset whose answers take OpenAI's file
    # object shape, api.openai_compat.file_object); NULL for our own purposes.
    openai_purpose: Mapped[str | None] = mapped_column(String(16))
