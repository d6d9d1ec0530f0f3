"""Initial schema: teams, api_keys, jobs and the job's events, metrics, samples, checkpoints.

Seeds the team ``default``: every job needs a team, and the service's single-token auth acts as
this team until multi-team auth arrives.

Revision ID: 0001_initial
Revises:
Create Date: 2025-11-29
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of what api.store.tables held when this revision was written: a revision must keep
# meaning the same schema after the models move on, so it imports nothing from api.
# BIGINT ids on Postgres, INTEGER on SQLite (its only auto-increment type).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JOB_STATUSES = (
    "'queued', 'dispatched', 'running', 'cancelling', 'succeeded', 'failed', 'cancelled', 'preempted'"
)
_PRIORITIES = "'low', 'normal', 'high'"


def _id() -> sa.Column:
    return sa.Column("id", _ID, autoincrement=True, nullable=False)


def _job_id() -> sa.Column:
    return sa.Column("job_id", _ID, nullable=False)


def _fk_job(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["job_id"], ["jobs.id"], name=op.f(f"fk_{table}_job_id_jobs"), ondelete="CASCADE"
    )


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    teams = op.create_table(
        "teams",
        _id(),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "api_keys",
        _id(),
        sa.Column("team_id", _ID, nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=128), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_api_keys_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_prefix"), "api_keys", ["prefix"], unique=False)
    op.create_index(op.f("ix_api_keys_team_id"), "api_keys", ["team_id"], unique=False)

    op.create_table(
        "jobs",
        _id(),
        sa.Column("team_id", _ID, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.String(length=8), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("max_steps", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=128), nullable=True),
        _ts("heartbeat_at", nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        _ts("created_at"),
        _ts("dispatched_at", nullable=True),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("latest_checkpoint", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_traceback", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.CheckConstraint(f"status IN ({_JOB_STATUSES})", name=op.f("ck_jobs_status")),
        sa.CheckConstraint(f"priority IN ({_PRIORITIES})", name=op.f("ck_jobs_priority")),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_jobs_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("team_id", "idempotency_key", name=op.f("uq_jobs_team_id_idempotency_key")),
    )
    op.create_index(op.f("ix_jobs_status_pool"), "jobs", ["status", "pool"], unique=False)
    op.create_index(op.f("ix_jobs_team_id"), "jobs", ["team_id"], unique=False)

    op.create_table(
        "job_events",
        _id(),
        _job_id(),
        _ts("ts"),
        sa.Column("level", sa.String(length=8), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        _fk_job("job_events"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index(op.f("ix_job_events_job_id"), "job_events", ["job_id"], unique=False)

    # (job_id, step) is unique in these three, so a retried write is harmless; the unique
    # index also serves lookups by job_id, which is why they have no index of their own.
    op.create_table(
        "job_metrics",
        _id(),
        _job_id(),
        sa.Column("step", sa.Integer(), nullable=False),
        _ts("ts"),
        sa.Column("payload", sa.JSON(), nullable=False),
        _fk_job("job_metrics"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_metrics")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_job_metrics_job_id_step")),
    )
    op.create_table(
        "job_samples",
        _id(),
        _job_id(),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("rows", sa.JSON(), nullable=False),
        _fk_job("job_samples"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_samples")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_job_samples_job_id_step")),
    )
    op.create_table(
        "checkpoints",
        _id(),
        _job_id(),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        _ts("created_at"),
        _fk_job("checkpoints"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_checkpoints_job_id_step")),
    )

    # No server defaults exist, so the seed states every non-null column itself.
    op.bulk_insert(teams, [{"name": "default", "weight": 1.0, "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    # Children before parents, so no foreign key ever points at a dropped table; each table's
    # indexes and constraints go with it.
    for table in ("checkpoints", "job_samples", "job_metrics", "job_events", "jobs", "api_keys", "teams"):
        op.drop_table(table)
