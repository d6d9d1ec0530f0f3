"""A job's device indices on its worker, recorded with the dispatch: a worker runs several jobs
at once on disjoint devices, and the scheduler, the job's child (``CUDA_VISIBLE_DEVICES``) and the
cluster view read which ones from here. Null for a job never dispatched, and for one dispatched
before this revision (the policy counts that one as holding its whole worker).

Revision ID: 0003_job_devices
Revises: 0002_scheduling
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_job_devices"
down_revision: str | Sequence[str] | None = "0002_scheduling"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("devices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("devices")
