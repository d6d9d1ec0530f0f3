"""``checkpoints.attempt``: the attempt that stored the checkpoint. With an object store apart from
the artifacts folder, each attempt stores under a key of its own (``step-N.attempt-A``), so a stale
attempt's upload can neither replace nor be confused with the owner's; readers take the key from
this row. Rows written before keep NULL: their checkpoint is stored under the plain ``step-N``.

Revision ID: 0023_checkpoint_attempt
Revises: 0022_file_rows
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_checkpoint_attempt"
down_revision: str | Sequence[str] | None = "0022_file_rows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("attempt")
