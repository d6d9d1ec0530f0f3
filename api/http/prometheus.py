"""What ``GET /metrics`` exports, in Prometheus' text format (``prometheus_client``).

A :class:`ServiceSnapshot` is read fresh on every scrape (SQL counts, Redis counters and
heartbeats, this process's stream subscribers) and turned into metric families by
:func:`families`, a pure function. No metric is kept in process memory, so every API replica
reports the same service-wide numbers (except ``grpo_stream_subscribers`` and
``grpo_spec_intake``, which are per process: sum them across replicas).

Cardinality stays bounded: labels are statuses, pools, teams and, for running jobs only (at
most one per worker), the job id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.domain.lifecycle import JOB_STATUSES, WAITING_STATUSES
from api.store.tables import Job, JobMetric, Team
from api.vocabulary import Heartbeat


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    team: str
    pool: str
    step: int
    step_seconds: float | None  # the latest step's wall time; None before the first step


@dataclass
class ServiceSnapshot:
    jobs_by_status: dict[str, int] = field(default_factory=dict)
    waiting_by_pool: dict[str, int] = field(default_factory=dict)
    running: list[RunningJob] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # api.store.bus.COUNTERS
    heartbeats: list[Heartbeat] = field(default_factory=list)
    seconds_since_scheduler_pass: float | None = None
    stream_subscribers: int = 0
    spec_intake: dict[str, int] = field(default_factory=dict)  # state -> submissions (per process)


def read_sql(session: Session) -> ServiceSnapshot:
    """The SQL part of a snapshot: three grouped counts and one indexed read per running job."""
    snapshot = ServiceSnapshot()
    snapshot.jobs_by_status = {status: 0 for status in JOB_STATUSES}
    by_status = select(Job.status, func.count()).group_by(Job.status)
    snapshot.jobs_by_status.update(session.execute(by_status).all())
    snapshot.waiting_by_pool = dict(session.execute(
        select(Job.pool, func.count()).where(Job.status.in_(WAITING_STATUSES)).group_by(Job.pool)).all())
    rows = session.execute(select(Job.id, Team.name, Job.pool, Job.last_step)
                           .join(Team, Team.id == Job.team_id)
                           .where(Job.status == "running").order_by(Job.id)).all()
    for job_id, team, pool, step in rows:
        payload = session.scalar(select(JobMetric.payload).where(JobMetric.job_id == job_id,
                                                                 JobMetric.step == step)) if step else None
        seconds = (payload or {}).get("step_time")
        snapshot.running.append(RunningJob(job_id, team, pool, step, seconds if seconds else None))
    return snapshot


def families(snapshot: ServiceSnapshot) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("grpo_jobs", "Jobs by status (terminal ones included)", labels=["status"])
    for status, count in sorted(snapshot.jobs_by_status.items()):
        jobs.add_metric([status], count)
    yield jobs
    queue = GaugeMetricFamily("grpo_queue_length", "Jobs waiting to be dispatched, by pool", labels=["pool"])
    for pool, count in sorted(snapshot.waiting_by_pool.items()):
        queue.add_metric([pool], count)
    yield queue
    yield CounterMetricFamily("grpo_dispatches", "Jobs the scheduler dispatched onto a worker",
                              value=snapshot.counters.get("dispatches", 0))
    yield CounterMetricFamily("grpo_preemptions", "Running jobs the scheduler asked to yield",
                              value=snapshot.counters.get("preemptions", 0))
    yield CounterMetricFamily("grpo_unclaimed_dispatches", "Dispatches no worker claimed within the claim "
                              "window (their message was lost), made again",
                              value=snapshot.counters.get("unclaimed_dispatches", 0))
    rate = GaugeMetricFamily("grpo_job_steps_per_second", "Optimizer steps per second of each running job "
                             "(from its latest step's wall time)", labels=["job_id", "team", "pool"])
    step = GaugeMetricFamily("grpo_job_step", "Latest optimizer step of each running job",
                             labels=["job_id", "team", "pool"])
    total = 0.0
    for job in snapshot.running:
        labels = [str(job.job_id), job.team, job.pool]
        step.add_metric(labels, job.step)
        if job.step_seconds:
            rate.add_metric(labels, 1.0 / job.step_seconds)
            total += 1.0 / job.step_seconds
    yield rate
    yield step
    yield GaugeMetricFamily("grpo_steps_per_second", "Optimizer steps per second over all running jobs",
                            value=total)
    yield from _capacity(snapshot.heartbeats)
    if snapshot.seconds_since_scheduler_pass is not None:
        yield GaugeMetricFamily("grpo_scheduler_pass_age_seconds", "Seconds since the scheduler's last pass",
                                value=snapshot.seconds_since_scheduler_pass)
    yield GaugeMetricFamily("grpo_stream_subscribers", "Open job streams (WebSockets) in this API process",
                            value=snapshot.stream_subscribers)
    intake = GaugeMetricFamily("grpo_spec_intake", "Submissions and clones in this API process whose spec is "
                               "being checked (running) or waits for a slot (waiting)", labels=["state"])
    for state in ("running", "waiting"):
        intake.add_metric([state], snapshot.spec_intake.get(state, 0))
    yield intake


def _capacity(heartbeats: list[Heartbeat]) -> Iterator[Metric]:
    workers = GaugeMetricFamily("grpo_workers", "Live workers, by pool", labels=["pool"])
    gpus = GaugeMetricFamily("grpo_gpus", "GPUs advertised by live workers, by pool and state",
                             labels=["pool", "state"])
    by_pool: dict[str, list[int]] = {}
    for beat in heartbeats:
        counts = by_pool.setdefault(beat.pool, [0, 0, 0])
        counts[0] += 1
        free = len(beat.free_devices)
        counts[1] += beat.gpus - free
        counts[2] += free
    for pool, (count, busy, free) in sorted(by_pool.items()):
        workers.add_metric([pool], count)
        gpus.add_metric([pool, "busy"], busy)
        gpus.add_metric([pool, "free"], free)
    yield workers
    yield gpus


class _Collected:
    """The one-method registry ``generate_latest`` asks for."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render(snapshot: ServiceSnapshot) -> bytes:
    return generate_latest(_Collected(list(families(snapshot))))  # type: ignore[arg-type]
