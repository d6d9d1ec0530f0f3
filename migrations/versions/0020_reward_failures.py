"""Rows a job's rewards left unscored, ``jobs.unscored_rows``: the sum of its ``reward_unscored``
warnings, so a job that trained on rows its rewards could not score reads (and shows) as
succeeded with warnings rather than a plain success. Jobs that ran before start at 0.

Revision ID: 0020_reward_failures
Revises: 0018_claim_window
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_reward_failures"
down_revision: str | Sequence[str] | None = "0018_claim_window"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("unscored_rows", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("unscored_rows")
