"""``teams.limits``: admins' overrides of what a team's members may do, a JSON object
(``api.schemas.admin.TeamLimits``): ``max_priority`` (the highest class they may give a job),
``max_queued_jobs`` (the team's waiting jobs at once), and the token buckets of their requests
(``reads_per_second``, ``read_burst``, ``writes_per_second``, ``write_burst``). A missing or null
field means the deployment's default (the ``GRPO_TEAM_*`` settings). One JSON column, as
``pools.limits``: every reader takes the limits whole, and the set will grow.

Revision ID: 0009_team_limits
Revises: 0008_job_capabilities
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_team_limits"
down_revision: str | Sequence[str] | None = "0008_job_capabilities"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("limits", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("limits")
