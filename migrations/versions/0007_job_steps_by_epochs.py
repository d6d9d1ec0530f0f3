"""``jobs.max_steps`` may be null: a job that trains by epochs (``grpo.max_steps: -1``, TRL's
default) over a file or hub dataset learns its step count only when its worker has loaded and
counted the prompts; the worker stores it then. Existing rows keep their count.

Revision ID: 0007_job_steps_by_epochs
Revises: 0006_verifiers
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_job_steps_by_epochs"
down_revision: str | Sequence[str] | None = "0006_verifiers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("max_steps", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    # A job never counted gets 0 steps: the old schema has no way to say "not known yet".
    op.execute("UPDATE jobs SET max_steps = 0 WHERE max_steps IS NULL")
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("max_steps", existing_type=sa.Integer(), nullable=False)
