"""Team-shared scheduling: pools, per-team quotas, GPU allocations (fair-share usage), a job's
pending reason and preempt flag, API key labels, and a positive team weight.

Seeds the pool ``default`` (the pool a spec names when it names none), so a fresh service
accepts jobs before its first worker has registered.

Revision ID: 0002_scheduling
Revises: 0001_initial
Create Date: 2026-11-29
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0002_scheduling"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies, as in 0001: this revision imports nothing from api.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    pools = op.create_table(
        "pools",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("held", sa.Boolean(), nullable=False),
        sa.Column("max_worker_gpus", sa.Integer(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pools")),
    )
    op.create_table(
        "team_quotas",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("team_id", _ID, nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.CheckConstraint("gpus >= 0", name=op.f("ck_team_quotas_gpus_not_negative")),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_team_quotas_team_id_teams"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["pool"], ["pools.name"], name=op.f("fk_team_quotas_pool_pools"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_team_quotas")),
        sa.UniqueConstraint("team_id", "pool", name=op.f("uq_team_quotas_team_id_pool")),
    )
    op.create_table(
        "allocations",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("team_id", _ID, nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        _ts("started_at"),
        _ts("ended_at", nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_allocations_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_allocations_team_id_teams"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocations")),
    )
    op.create_index(op.f("ix_allocations_job_id"), "allocations", ["job_id"], unique=False)
    op.create_index(op.f("ix_allocations_pool_ended_at"), "allocations", ["pool", "ended_at"], unique=False)

    # Existing rows need a value; the server default stays (the models set the same in Python).
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("preempt_requested", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("pending_reason", sa.String(length=32), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("label", sa.String(length=128), nullable=True))
    with op.batch_alter_table("teams") as batch:
        batch.create_check_constraint(op.f("ck_teams_weight_positive"), "weight > 0")

    op.bulk_insert(pools, [{"name": "default", "held": False, "max_worker_gpus": None,
                            "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.drop_constraint(op.f("ck_teams_weight_positive"), type_="check")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("label")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pending_reason")
        batch.drop_column("preempt_requested")
    for table in ("allocations", "team_quotas", "pools"):
        op.drop_table(table)
