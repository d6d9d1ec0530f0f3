"""What a team's members may do: its admins' overrides (:class:`api.schemas.admin.TeamLimits`)
over the deployment's defaults (``GRPO_TEAM_*``), and the rules that read them. Pure, so the
store (queue cap, priority), the HTTP layer (rate limits) and the CLI share one reading.

Members are held to all of them; admin keys only to ``max_queued_jobs``, which bounds the
queue the scheduler orders whoever filled it (an admin throttled in an incident could not even
raise a team's limit), and the GPU-hour budget (:mod:`api.limits.budgets`), which bounds what
the team spends whoever submitted.
"""

from __future__ import annotations

from api.domain.errors import InvalidInput
from api.schemas.admin import TeamLimits
from api.settings import Settings
from api.vocabulary import PRIORITIES


def effective_team_limits(overrides: TeamLimits, settings: Settings) -> TeamLimits:
    """The overrides with every unset field at its default: no field is None but
    ``gpu_hours_budget``, where None is no budget."""
    defaults = TeamLimits(max_priority=settings.team_max_priority,
                          max_queued_jobs=settings.team_max_queued_jobs,
                          reads_per_second=settings.team_reads_per_second,
                          read_burst=settings.team_read_burst,
                          writes_per_second=settings.team_writes_per_second,
                          write_burst=settings.team_write_burst,
                          serve_idle_seconds=settings.team_serve_idle_seconds,
                          gpu_hours_budget=settings.team_gpu_hours_budget,
                          budget_period=settings.team_budget_period)
    return defaults.model_copy(update=overrides.model_dump(exclude_none=True))


def priority_rank(priority: str) -> int:
    return PRIORITIES.index(priority)


def check_priority(priority: str, highest: str) -> None:
    """:class:`InvalidInput` naming ``priority`` when it is above the team's ``highest`` class."""
    if priority_rank(priority) > priority_rank(highest):
        allowed = ", ".join(PRIORITIES[: priority_rank(highest) + 1])
        raise InvalidInput(f"priority '{priority}' is above your team's highest class '{highest}' "
                           f"(you may use {allowed}; an admin may set a higher one)", param="priority")


def default_priority(highest: str) -> str:
    """The class of a spec that names none: ``normal``, or the team's highest when that is lower,
    so a team held to ``low`` can still submit a spec written without a priority."""
    return PRIORITIES[min(priority_rank("normal"), priority_rank(highest))]
