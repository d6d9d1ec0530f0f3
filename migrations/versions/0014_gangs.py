"""Jobs that span hosts (gangs): ``jobs.placement`` (every host of a dispatch with its devices),
``job_hosts`` (each host's join and lease for the length of one dispatch, and the gang's rendezvous)
and ``pools.total_gpus`` (the most GPUs a gang of the pool may ask for). A job dispatched before
has its one host in ``worker_id`` and ``devices``, which reads still fall back to: nothing to fill.

Revision ID: 0014_gangs
Revises: 0013_files
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_gangs"
down_revision: str | Sequence[str] | None = "0013_files"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
    with op.batch_alter_table("pools") as batch:
        batch.add_column(sa.Column("total_gpus", sa.Integer(), nullable=True))
    op.create_table(
        "job_hosts",
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=128), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rendezvous", sa.String(length=300), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_hosts_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "node_rank", name=op.f("pk_job_hosts")),
    )


def downgrade() -> None:
    op.drop_table("job_hosts")
    with op.batch_alter_table("pools") as batch:
        batch.drop_column("total_gpus")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("placement")
