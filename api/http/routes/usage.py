"""``GET /v1/usage``: each team's GPU-seconds per pool over a window (default: the last 7 days),
from the allocations the scheduler's dispatches recorded, and what each team has left of its
GPU-hour budget this period. A member sees its own team's rows; an admin sees every team's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from api.domain.errors import InvalidInput
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.schemas.usage import SECONDS_PER_HOUR, UsageItem, UsageView
from api.store import usage
from api.store.budgets import budget_read, team_budgets
from api.store.clock import db_now

router = APIRouter(tags=["scheduling"])
DEFAULT_DAYS = 7
MAX_DAYS = 366  # a year, leap day included: the window is bounded so one read stays cheap
_TIME_HELP = "ISO 8601; no offset means UTC"


def usage_window(since: datetime | None, until: datetime | None, days: int | None, now: datetime,
                 ) -> tuple[datetime, datetime]:
    """``[since, until)`` in UTC from what the caller gave: ``days`` back from ``until`` (now),
    or ``since``/``until`` (either defaults: ``until`` to now, ``since`` to 7 days before
    ``until``). :class:`InvalidInput` naming the parameter when it is empty, longer than
    :data:`MAX_DAYS` or outside the calendar."""
    if days is not None and since is not None:
        raise InvalidInput("give days or since, not both", param="days")
    end = now if until is None else _utc(until, "until")
    if since is not None:
        start = _utc(since, "since")
    else:
        try:
            start = end - timedelta(days=days or DEFAULT_DAYS)
        except OverflowError:  # an until in year 1
            raise InvalidInput("too early to count days back from", param="until") from None
    if start >= end:
        raise InvalidInput("must be before until", param="since")
    if end - start > timedelta(days=MAX_DAYS):
        raise InvalidInput(f"the window may span at most {MAX_DAYS} days", param="since")
    return start, end


def _utc(moment: datetime, param: str) -> datetime:
    try:
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:  # an offset that moves it past year 1 or 9999
        raise InvalidInput("outside the dates a window may span", param=param) from None


@router.get("/usage", response_model=UsageView,
            responses={422: {"description": "A bad window; `param` names the parameter"}})
def get_usage(session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
              since: Annotated[datetime | None, Query(description=f"Window start; {_TIME_HELP}")] = None,
              until: Annotated[datetime | None, Query(description=f"Window end, excluded (default now); "
                                                                  f"{_TIME_HELP}")] = None,
              days: Annotated[int | None, Query(ge=1, le=MAX_DAYS, description="The last N days "
                                                "before until (default 7); not with since")] = None,
              ) -> UsageView:
    """GPU-seconds (and hours) each team used per pool in ``[since, until)``: every stretch of
    GPUs a job held, times how long of it lies in the window (a job still running counts up to
    now); and each team's GPU-hour budget in its current period, what it used of it and what is
    left (``budgets``, whatever the window). A member sees its own team's rows only."""
    now = db_now(session)
    start, end = usage_window(since, until, days, now)
    rows = usage.gpu_usage(session, start, end, now, principal.scope)
    items = [UsageItem(team=row.team, pool=row.pool, gpu_seconds=row.gpu_seconds,
                       gpu_hours=row.gpu_seconds / SECONDS_PER_HOUR) for row in rows]
    scope = None if principal.scope is None else [principal.scope]
    budgets = [budget_read(budget) for budget in team_budgets(session, settings, now, scope)]
    return UsageView(since=start, until=end, items=items, budgets=budgets)
