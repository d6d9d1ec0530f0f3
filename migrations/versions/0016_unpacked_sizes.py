"""``files.unpacked_bytes``: what a model archive's files add up to unpacked (a worker's cache
holds them so, and the team's artifact quota counts them so); NULL for a dataset, which is used
as uploaded. Archives uploaded before were bounded only by their compressed size: they keep NULL
and count as uploaded, as before.

Revision ID: 0016_unpacked_sizes
Revises: 0015_webhook_egress
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_unpacked_sizes"
down_revision: str | Sequence[str] | None = "0015_webhook_egress"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("unpacked_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("unpacked_bytes")
