"""``files.rows``: how many rows a dataset holds, counted by its upload's check, so a spec drawing
more prompts a round than the file has is warned of at submit. Datasets uploaded before keep NULL:
the worker warns when it loads them, as before.

Revision ID: 0022_file_rows
Revises: 0021_file_columns
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_file_rows"
down_revision: str | Sequence[str] | None = "0021_file_columns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("rows", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("rows")
