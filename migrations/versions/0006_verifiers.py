"""Verifier services registered by admins for ``http_verifier`` rewards (issue 15): a name, the
team or pool whose jobs may use it, its URL, an optional auth header (name and secret value) and
its limits (request timeout, requests in flight per job, rows per request).

Revision ID: 0006_verifiers
Revises: 0005_pool_limits
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_verifiers"
down_revision: str | Sequence[str] | None = "0005_pool_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "verifiers",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("auth_header", sa.String(128), nullable=True),
        sa.Column("auth_secret", sa.Text(), nullable=True),
        sa.Column("timeout_seconds", sa.Float(), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=False),
        sa.Column("max_batch_size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("(team_id IS NULL) <> (pool IS NULL)", name=op.f("ck_verifiers_one_scope")),
        sa.CheckConstraint("timeout_seconds > 0", name=op.f("ck_verifiers_timeout_positive")),
        sa.CheckConstraint("max_concurrency >= 1 AND max_batch_size >= 1",
                           name=op.f("ck_verifiers_limits_positive")),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_verifiers_team_id_teams"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["pool"], ["pools.name"], name=op.f("fk_verifiers_pool_pools"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_verifiers")),
    )


def downgrade() -> None:
    op.drop_table("verifiers")
