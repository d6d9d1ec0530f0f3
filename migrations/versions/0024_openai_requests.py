"""What OpenAI's fine-tuning API (``/v1/fine_tuning/jobs``, ``POST /v1/files`` with
``purpose=fine-tune``) records beside our own rows, each column NULL for everything made through
our own routes:

- ``jobs.openai_request``: what a job's OpenAI create carried that its spec does not hold: the
  ``method`` as sent (its grader as OpenAI's JSON), ``metadata`` and ``suffix``; the job's OpenAI
  view echoes them and ``GET /v1/fine_tuning/jobs?metadata[k]=v`` filters on the metadata.
- ``files.openai_purpose``: the OpenAI purpose an upload named (``fine-tune``). The file is a
  ``dataset`` in every other respect (its ``purpose`` column, the submit's checks, the worker),
  so the ``purpose`` constraint and everything that reads it stay as they were; only its answers
  take OpenAI's file object shape.

Revision ID: 0024_openai_requests
Revises: 0023_checkpoint_attempt
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024_openai_requests"
down_revision: str | Sequence[str] | None = "0023_checkpoint_attempt"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("openai_request", sa.JSON(), nullable=True))
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("openai_purpose", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("openai_purpose")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("openai_request")
