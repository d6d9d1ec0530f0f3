"""Training that watches itself (issue 37): a job's alerts and its best checkpoint, on its row so
that a job read and the jobs list show them without reading events or metrics.

- ``jobs.alerts``: the health rules that tripped, one entry per rule with its latest trip
  (``[{"rule", "step", "action", "value"}]``, :mod:`grpo_core.run.health`); NULL: none.
- ``jobs.best``: the job's best eval point by ``grpo.metric_for_best_model``
  (``{"step", "metric", "value"}``); NULL: no such metric, or no eval point yet.

Revision ID: 0026_job_health
Revises: 0025_serving_jobs
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026_job_health"
down_revision: str | Sequence[str] | None = "0025_serving_jobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("alerts", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("best", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("best")
        batch.drop_column("alerts")
