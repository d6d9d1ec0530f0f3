"""Serving jobs (``POST /v1/chat/completions``, ``POST /v1/completions``): a job row that holds a
device to answer chat requests from a job's model, placed, charged and preempted like training.

- ``jobs.kind``: ``train`` (every existing row) or ``serve``; its spec is then a ``ServeSpec``
  (``api.domain.serve_spec``).
- ``jobs.serve_model``: a serving job's model source (``job:ID[@STEP]``); NULL for training.
- ``uq_jobs_serving``: at most one live serving job (queued, dispatched, running, preempted) per
  team and model, so two first requests at once start one job, not two. A partial unique index,
  which Postgres and SQLite both have.

Revision ID: 0025_serving_jobs
Revises: 0024_openai_requests
Create Date: 2026-12-09
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_serving_jobs"
down_revision: str | Sequence[str] | None = "0024_openai_requests"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As they are at this revision (api.domain.serve_spec), not imported: a revision never changes.
_KINDS = ("train", "serve")
_LIVE = "kind = 'serve' AND status IN ('queued', 'dispatched', 'running', 'preempted')"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(length=8), nullable=False, server_default="train"))
        batch.add_column(sa.Column("serve_model", sa.String(length=64), nullable=True))
        batch.create_check_constraint(op.f("ck_jobs_kind"), f"kind IN {_KINDS}")
    op.create_index("uq_jobs_serving", "jobs", ["team_id", "serve_model"], unique=True,
                    postgresql_where=sa.text(_LIVE), sqlite_where=sa.text(_LIVE))


def downgrade() -> None:
    op.drop_index("uq_jobs_serving", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("ck_jobs_kind"), type_="check")
        batch.drop_column("serve_model")
        batch.drop_column("kind")
