"""``jobs.required_capabilities``: what a worker must advertise to run the job (e.g.
``code_sandbox`` for the code_tests reward), a sorted JSON list computed from the job's rewards at
submit. The scheduler reads it with the other columns it places by, never the spec, so a tick
over 10,000 waiting jobs stays cheap. Null (rows from before): nothing required.

Unfinished jobs are filled in from their specs, with the one reward that needed a capability when
this revision was written, so a code_tests job queued before the upgrade is not dispatched to a
worker without the sandbox.

Revision ID: 0008_job_capabilities
Revises: 0007_job_steps_by_epochs
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_job_capabilities"
down_revision: str | Sequence[str] | None = "0007_job_steps_by_epochs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen as of this revision: later rewards fill the column at submit.
_NEEDED_BY_REWARD = {"code_tests": "code_sandbox"}
_FINISHED = ("succeeded", "failed", "cancelled")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("required_capabilities", sa.JSON(), nullable=True))
    jobs = sa.table("jobs", sa.column("id", sa.BigInteger()), sa.column("spec", sa.JSON()),
                    sa.column("status", sa.String()), sa.column("required_capabilities", sa.JSON()))
    conn = op.get_bind()
    updates = []
    unfinished = sa.select(jobs.c.id, jobs.c.spec).where(jobs.c.status.not_in(_FINISHED))
    for job_id, spec in conn.execute(unfinished):
        rewards = (spec or {}).get("rewards") or []
        needed = sorted({_NEEDED_BY_REWARD[r["name"]] for r in rewards
                         if isinstance(r, dict) and r.get("name") in _NEEDED_BY_REWARD})
        if needed:
            updates.append({"job_id": job_id, "needed": needed})
    if updates:
        conn.execute(jobs.update().where(jobs.c.id == sa.bindparam("job_id"))
                     .values(required_capabilities=sa.bindparam("needed")), updates)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("required_capabilities")
