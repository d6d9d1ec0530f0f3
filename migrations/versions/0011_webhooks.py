"""Per-team webhooks and their deliveries (``/v1/webhooks``).

``webhooks`` holds each registration and the secret its deliveries are signed with;
``webhook_deliveries`` is the outbox a job's final transition writes in its own transaction,
then the record of sending it, which the scheduler process's sender claims by
``(status, next_attempt_at)``. Nothing existed before, so there is nothing to fill in.

Revision ID: 0011_webhooks
Revises: 0010_job_tags
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_webhooks"
down_revision: str | Sequence[str] | None = "0010_job_tags"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("team_id", _ID, nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_webhooks_team_id_teams"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index(op.f("ix_webhooks_team_id"), "webhooks", ["team_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("webhook_id", _ID, nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')",
                           name=op.f("ck_webhook_deliveries_status")),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"],
                                name=op.f("fk_webhook_deliveries_webhook_id_webhooks"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_webhook_deliveries_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(op.f("ix_webhook_deliveries_webhook_id"), "webhook_deliveries", ["webhook_id"])
    op.create_index("ix_webhook_deliveries_status_next_attempt_at", "webhook_deliveries",
                    ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_status_next_attempt_at", table_name="webhook_deliveries")
    op.drop_index(op.f("ix_webhook_deliveries_webhook_id"), table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index(op.f("ix_webhooks_team_id"), table_name="webhooks")
    op.drop_table("webhooks")
