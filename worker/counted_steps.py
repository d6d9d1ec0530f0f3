"""What submit could not count, counted by the worker once the data is loaded and checked against
the pool's limits there; the trainer's ``started`` event carries the counts.

* The step count of a job that trains by epochs (``grpo.max_steps: -1``) over a file or hub
  dataset: unknown at submit, where the dataset is not read. Checked against the pool's step
  limits (:func:`api.limits.pool_limits.step_limit_problems`) and stored so the API and the dashboard
  show the job's length.
* The eval prompts of an ``eval_dataset`` from a file or the hub: an eval point generates for
  all of them, so they are held to the pool's per-step token bound
  (:func:`api.limits.pool_limits.eval_limit_problems`), as inline eval rows are at submit.

A job over a limit fails ``invalid_spec`` naming the field, before its first step (and before an
eval at step 0); nothing is stored, so a retry after the limits were raised is checked again.
"""

from __future__ import annotations

from typing import Any

from api.domain.job_spec import JobSpec
from api.limits.pool_limits import effective_limits, eval_limit_problems, step_limit_problems
from api.schemas.admin import PoolLimits
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store.attempts import record_max_steps
from api.store.db import session_scope
from api.store.pools import admission
from grpo_core.errors import SpecError
from grpo_core.run.callbacks import TrainerCallback
from worker.retrying import retry_transient

EVAL_SOURCE_FIELD = "eval_dataset.source"  # what to change: the rows are not in the spec


class CountedSteps(TrainerCallback):
    """Rank 0's check of the counts submit could not make, and record of the step count (a no-op
    for a job counted at submit whose eval rows, if any, were inline)."""

    def __init__(self, settings: Settings, job: JobRead, spec: JobSpec) -> None:
        self.settings, self.job, self.spec = settings, job, spec

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type != "started":
            return
        steps = int(data["max_steps"]) if self.job.max_steps is None else None
        evaluation = self.spec.eval_dataset
        # Inline eval rows were checked at submit; the trainer names the count only when it evaluates.
        eval_prompts = (int(data["eval_prompts"]) if "eval_prompts" in data and evaluation is not None
                        and evaluation.prompts is None else None)
        if steps is None and eval_prompts is None:
            return

        def check_and_record() -> list[SpecError]:
            with session_scope(self.settings.database_url) as session:
                found = admission(session, self.job.pool)
                overrides = found[1] if found is not None else PoolLimits()
                limits = effective_limits(overrides, self.settings)
                problems = step_limit_problems(self.spec, steps, limits) if steps is not None else []
                if eval_prompts is not None:
                    problems += eval_limit_problems(self.spec, eval_prompts, limits, EVAL_SOURCE_FIELD)
                if steps is not None and not problems:
                    record_max_steps(session, self.job.id, steps)
                return problems

        problems = retry_transient(check_and_record, self.settings.db_retry_seconds,
                                   f"job {self.job.id}: counts at start")
        if problems:
            raise SpecError(problems[0].field, problems[0].reason)
