"""``files.columns`` and ``files.prompt_field``: a dataset's columns and the prompt field its rows
were checked with at upload, so a spec naming the file is checked against them at submit and
takes the prompt field it does not set itself. Datasets uploaded before keep NULL in both: their
specs are checked on the worker, as before.

Revision ID: 0021_file_columns
Revises: 0020_reward_failures
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_file_columns"
down_revision: str | Sequence[str] | None = "0020_reward_failures"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("columns", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("prompt_field", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("prompt_field")
        batch.drop_column("columns")
