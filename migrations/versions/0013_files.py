"""Per-team uploaded files (``/v1/files``): a dataset or a model archive, its bytes in the object
store under ``files/{id}``. Nothing existed before, so there is nothing to fill in.

Revision ID: 0013_files
Revises: 0012_job_deletion
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_files"
down_revision: str | Sequence[str] | None = "0012_job_deletion"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("team_id", _ID, nullable=False),
        sa.Column("purpose", sa.String(length=16), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("purpose IN ('dataset', 'model')", name=op.f("ck_files_purpose")),
        sa.CheckConstraint("status IN ('uploading', 'ready', 'error')", name=op.f("ck_files_status")),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_files_team_id_teams"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index("ix_files_team_id_created_at", "files", ["team_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_files_team_id_created_at", table_name="files")
    op.drop_table("files")
