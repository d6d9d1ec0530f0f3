"""Columns the fault-tolerance work needs (issue 11):

* ``jobs.retry_at``: a job requeued after an infrastructure fault waits until this time (the
  database's clock) before it is dispatched again, so a fault that repeats at once does not spin
  through the attempt limit in seconds. Null: dispatchable now.
* ``job_metrics.attempt``: which attempt wrote the step's record. A retried write of the same
  attempt is a no-op; a later attempt that trains the step again (it resumed from an older
  checkpoint) replaces the record, so SQL holds the step the model actually took, once.
* ``teams.artifact_quota_bytes``: the most bytes a team's checkpoints may occupy (null: no limit),
  checked before each checkpoint is written.

Revision ID: 0004_fault_tolerance
Revises: 0003_job_devices
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_fault_tolerance"
down_revision: str | Sequence[str] | None = "0003_job_devices"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("job_metrics") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("artifact_quota_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("artifact_quota_bytes")
    with op.batch_alter_table("job_metrics") as batch:
        batch.drop_column("attempt")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("retry_at")
