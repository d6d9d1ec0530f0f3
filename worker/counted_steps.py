"""The step count of a job that trains by epochs (``grpo.max_steps: -1``) over a file or hub
dataset: unknown at submit, where the dataset is not read, it is known once the trainer has
counted the prompts and says so in its ``started`` event. Then it is checked against the pool's
step limits, which submit could not do (:func:`api.pool_limits.step_limit_problems`), and stored
so the API and the dashboard show the job's length.

A job over a limit fails ``invalid_spec`` naming the field, before its first step; nothing is
stored, so a retry after the limits were raised is checked again.
"""

from __future__ import annotations

from typing import Any

from api.job_spec import JobSpec
from api.pool_limits import effective_limits, step_limit_problems
from api.schemas.admin import PoolLimits
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store.attempts import record_max_steps
from api.store.db import session_scope
from api.store.pools import admission
from grpo_core.errors import SpecError
from grpo_core.run.callbacks import TrainerCallback
from worker.retrying import retry_transient


class CountedSteps(TrainerCallback):
    """Rank 0's check and record of the counted step count (a no-op for a job counted at submit)."""

    def __init__(self, settings: Settings, job: JobRead, spec: JobSpec) -> None:
        self.settings, self.job, self.spec = settings, job, spec

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type != "started" or self.job.max_steps is not None:
            return
        steps = int(data["max_steps"])

        def check_and_record() -> list[SpecError]:
            with session_scope(self.settings.database_url) as session:
                found = admission(session, self.job.pool)
                overrides = found[1] if found is not None else PoolLimits()
                problems = step_limit_problems(self.spec, steps, effective_limits(overrides, self.settings))
                if not problems:
                    record_max_steps(session, self.job.id, steps)
                return problems

        problems = retry_transient(check_and_record, self.settings.db_retry_seconds,
                                   f"job {self.job.id}: step count")
        if problems:
            raise SpecError(problems[0].field, problems[0].reason)
