"""Per-pool limits set by admins (issue 12), and pausing and retrying jobs (issue 13):

* ``pools.limits``, a JSON object of overrides (max_tokens_per_step, max_steps,
  max_checkpoints_per_job, max_inline_dataset_bytes, job_memory_bytes); a missing or null field
  means the deployment's default (GRPO_POOL_* settings). One JSON column rather than five: the
  set of limits will grow, and every reader takes them whole.
* job statuses ``pausing`` and ``paused`` (the status check constraint, rebuilt);
* ``jobs.attempt_base``: ``attempt`` when the job was last retried by hand, where the attempt
  limit counts from (a retried job gets a fresh budget without its attempt numbers going back,
  which the per-attempt metrics rely on).

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


_STATUSES_BEFORE = ("queued", "dispatched", "running", "cancelling", "succeeded", "failed", "cancelled",
                    "preempted")
_STATUSES = (*_STATUSES_BEFORE, "pausing", "paused")


def _status_check(batch, statuses: tuple[str, ...]) -> None:
    batch.drop_constraint(op.f("ck_jobs_status"), type_="check")
    batch.create_check_constraint(op.f("ck_jobs_status"), f"status IN {statuses}")


def upgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.add_column(sa.Column("limits", sa.JSON(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attempt_base", sa.Integer(), nullable=False, server_default="0"))
        _status_check(batch, _STATUSES)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        _status_check(batch, _STATUSES_BEFORE)
        batch.drop_column("attempt_base")
    with op.batch_alter_table("pools") as batch:
        batch.drop_column("limits")
