"""A dispatch's number, ``jobs.dispatches``: each dispatch's message carries it, and only a delivery
of the job's current dispatch may claim it (or join its gang). A dispatch not claimed within the
claim window is dispatched again, and the old dispatch's message, should it still arrive, is
refused. Jobs dispatched before start at 0, as their messages carry no number (accepted as before).

Revision ID: 0018_claim_window
Revises: 0016_unpacked_sizes
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_claim_window"
down_revision: str | Sequence[str] | None = "0016_unpacked_sizes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("dispatches", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("dispatches")
