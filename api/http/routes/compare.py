"""``GET /v1/jobs/compare``: several jobs side by side — their metrics over steps and where
their specs differ. Scoped like a job read: an id the caller may not see is a 404, as if the
job did not exist. Its own router, included before ``/jobs/{job_id}`` so that path never
takes ``compare`` for an id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from api.domain.errors import InvalidInput, NotFound
from api.domain.spec_diff import spec_differences, within_budget
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.http.params import MAX_BIGINT, ascii_digits
from api.schemas.compare import ComparedJob, Comparison, SpecDifference
from api.store import metric_series
from api.store.tables import Job

router = APIRouter(tags=["telemetry"])
MIN_JOBS, MAX_JOBS = 2, 10
MAX_METRICS = 20
MAX_METRIC_NAME = 200
MAX_POINTS = 2000  # per job and metric: a chart's width in pixels holds no more
# In all, over every job and metric asked for (10 jobs x 20 metrics would be 400,000 points, ~10 MB
# of JSON): each series gets its share, at least its first and last step.
MAX_TOTAL_POINTS = 40_000
DEFAULT_METRIC = "reward"


def listed(values: list[str] | None) -> list[str]:
    """``a,b`` and repeated parameters alike, blanks and repeats dropped, first seen first."""
    items = (item.strip() for value in values or [] for item in value.split(","))
    return list(dict.fromkeys(item for item in items if item))


def job_ids(values: list[str] | None) -> list[int]:
    """The distinct ids asked for; :class:`InvalidInput` naming ``ids`` unless there are 2 to 10
    of them, each a job id in ASCII digits (``int`` alone would read ``٤`` as 4, and fail on ``²``)."""
    texts = listed(values)
    if not all(ascii_digits(text) and 1 <= int(text) <= MAX_BIGINT for text in texts):
        raise InvalidInput("ids are job ids: whole numbers from 1, in ASCII digits", param="ids")
    ids = list(dict.fromkeys(int(text) for text in texts))
    if not MIN_JOBS <= len(ids) <= MAX_JOBS:
        raise InvalidInput(f"compare {MIN_JOBS} to {MAX_JOBS} distinct jobs", param="ids")
    return ids


def metric_choice(values: list[str] | None) -> list[str]:
    names = listed(values) or [DEFAULT_METRIC]
    if len(names) > MAX_METRICS:
        raise InvalidInput(f"at most {MAX_METRICS} metrics", param="metrics")
    if any(len(name) > MAX_METRIC_NAME for name in names):
        raise InvalidInput(f"a metric name has at most {MAX_METRIC_NAME} characters", param="metrics")
    return names


@router.get("/jobs/compare", response_model=Comparison,
            responses={404: {"description": "A job that does not exist or is another team's; "
                                            "`param` is `ids`"},
                       422: {"description": "Not 2 to 10 job ids, or too many or too long metric names"}})
def compare_jobs(
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    ids: Annotated[list[str], Query(max_length=MAX_JOBS, description=(
        f"{MIN_JOBS} to {MAX_JOBS} job ids, comma-separated (or repeat the parameter)"))],
    metrics: Annotated[list[str] | None, Query(max_length=MAX_METRICS, description=(
        f"Metrics to plot, comma-separated or repeated (default `{DEFAULT_METRIC}`)"))] = None,
) -> Comparison:
    """Each metric's ``[step, value]`` points per job (at most 2,000 a job and metric, and 40,000
    in all, evenly thinned, first and last step kept), the numeric metrics the jobs recorded, and
    the spec fields whose values differ between the jobs (a field a spec lacks is null there),
    computed here and bounded by ``GRPO_COMPARE_DIFF_BYTES``: differences past it are left out and
    counted in ``spec_diff_omitted``."""
    wanted, names = job_ids(ids), metric_choice(metrics)
    query = select(Job).where(Job.id.in_(wanted), Job.deleted_at.is_(None))
    if principal.scope is not None:
        query = query.where(Job.team_id == principal.scope)
    found = {job.id: job for job in session.scalars(query)}
    missing = [job_id for job_id in wanted if job_id not in found]
    if missing:
        raise NotFound(f"no such job: {', '.join(map(str, missing))}", param="ids")
    jobs = [found[job_id] for job_id in wanted]
    points = max(2, min(MAX_POINTS, MAX_TOTAL_POINTS // (len(jobs) * len(names))))
    differences, omitted = within_budget(spec_differences({job.id: job.spec for job in jobs}),
                                         settings.compare_diff_bytes)
    return Comparison(
        jobs=[ComparedJob(id=job.id, name=job.name, status=job.status) for job in jobs],
        metrics={name: {job.id: metric_series.series(session, job.id, name, points) for job in jobs}
                 for name in names},
        metric_names=metric_series.metric_names(session, wanted),
        spec_diff=[SpecDifference(**row) for row in differences],
        spec_diff_omitted=omitted,
    )
