"""A deleted job's tombstone (``DELETE /v1/jobs/{id}``): ``jobs.deleted_at``, set when a team
deletes a finished job. The row stays, emptied of the team's data (spec, description, tags,
traceback), so that its allocations still count in the team's GPU-hours and its webhook deliveries
stay listable; every read hides it. Jobs from before were never deleted: null.

Revision ID: 0012_job_deletion
Revises: 0011_webhooks
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_job_deletion"
down_revision: str | Sequence[str] | None = "0011_webhooks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("deleted_at")
