"""Per-pool limits set by admins (issue 12): ``pools.limits``, a JSON object of overrides
(max_tokens_per_step, max_steps, max_checkpoints_per_job, max_inline_dataset_bytes,
job_memory_bytes); a missing or null field means the deployment's default (GRPO_POOL_* settings).
One JSON column rather than five: the set of limits will grow, and every reader takes them whole.

Revision ID: 0005_pool_limits
Revises: 0004_fault_tolerance
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_pool_limits"
down_revision: str | Sequence[str] | None = "0004_fault_tolerance"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.add_column(sa.Column("limits", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.drop_column("limits")
