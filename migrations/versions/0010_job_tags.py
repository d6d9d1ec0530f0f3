"""A job's ``tags`` and ``description``, to find it again (``GET /v1/jobs?tag=&q=``).

``jobs.tags`` (a JSON list, in the spec's order) and ``jobs.description`` (text) are what a job
read shows; ``job_tags`` holds the same tags one a row, indexed by tag, which is what the list
filters on: an equality on an index on both databases. Jobs from before have no tags and no
description (their specs had no such fields), so there is nothing to fill in.

Revision ID: 0010_job_tags
Revises: 0009_team_limits
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_job_tags"
down_revision: str | Sequence[str] | None = "0009_team_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("description", sa.Text(), nullable=True))
    op.create_table(
        "job_tags",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_tags_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "tag", name=op.f("pk_job_tags")),
    )
    op.create_index("ix_job_tags_tag_job_id", "job_tags", ["tag", "job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_tags_tag_job_id", table_name="job_tags")
    op.drop_table("job_tags")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("description")
        batch.drop_column("tags")
