"""GPU-hour budgets (issue 37): a job's own budget on its row, beside its spec.

- ``jobs.max_gpu_hours``: the spec's ``resources.max_gpu_hours`` (NULL: none), so the scheduler's
  budget pass finds the jobs that have one without reading specs. No job before this revision
  has one: specs could not name it. A team's budget lives in ``teams.limits`` (JSON), no column.
- ``ix_allocations_team_id_ended_at``: each pass sums the current period's allocations of every
  team with a budget; by team and end, not over the whole history.

Revision ID: 0027_budgets
Revises: 0026_job_health
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_budgets"
down_revision: str | Sequence[str] | None = "0026_job_health"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("max_gpu_hours", sa.Float(), nullable=True))
    op.create_index("ix_allocations_team_id_ended_at", "allocations", ["team_id", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_allocations_team_id_ended_at", table_name="allocations")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("max_gpu_hours")
