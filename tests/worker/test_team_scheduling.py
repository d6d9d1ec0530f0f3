"""Three teams share two real worker slots through the real scheduler: quotas hold at every
sampled moment, teams take turns by weighted fair share (not submission order), a high job goes
first, and ``/v1/queue`` and ``/v1/cluster`` show it all. Then a high job of a team under its
quota preempts an over-share job, which checkpoints, waits, and resumes from that checkpoint
with every step recorded exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.domain.job_spec import JobSpec
from api.domain.lifecycle import HOLDING_STATUSES, TERMINAL_STATUSES
from api.main import create_app
from api.store.db import session_scope
from api.store.jobs import create_job
from api.store.pools import ensure_pool, set_held
from api.store.tables import Job, JobEvent
from api.store.teams import create_team, set_quota
from api.store.telemetry import list_events, list_metrics

pytestmark = pytest.mark.slow


@pytest.fixture
def api(settings) -> Iterator[TestClient]:
    """The real app in-process, auth off (every caller an admin), on this module's DB and Redis."""
    with TestClient(create_app(settings.model_copy(update={"auth": "none"}))) as client:
        yield client


def team(database_url: str, name: str, weight: float = 1.0, quota: tuple[str, int] | None = None) -> int:
    with session_scope(database_url) as session:
        created = create_team(session, name, weight)
        if quota is not None:
            ensure_pool(session, quota[0])
            set_quota(session, name, *quota)
    return created.id


def submit_as(database_url: str, team_id: int, spec: dict[str, Any]) -> int:
    with session_scope(database_url) as session:
        job, _ = create_job(session, team_id, JobSpec.model_validate(spec))
    return job.id


def hold(database_url: str, pool: str, held: bool) -> None:
    with session_scope(database_url) as session:
        ensure_pool(session, pool)
        set_held(session, pool, held)


def holding_by_team(database_url: str, pool: str) -> dict[int, int]:
    with session_scope(database_url) as session:
        rows = session.execute(select(Job.team_id, Job.gpus).where(Job.pool == pool,
                                                                   Job.status.in_(HOLDING_STATUSES)))
        held: dict[int, int] = {}
        for team_id, gpus in rows:
            held[team_id] = held.get(team_id, 0) + gpus
    return held


def dispatch_order(database_url: str, job_ids: list[int]) -> list[int]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(JobEvent.job_id).where(JobEvent.job_id.in_(job_ids),
                                                                  JobEvent.type == "dispatched")
                                    .order_by(JobEvent.id)))


class Sampler:
    """Reads who holds what every 50 ms while the jobs run, from another thread."""

    def __init__(self, database_url: str, pool: str) -> None:
        self.database_url, self.pool = database_url, pool
        self.samples: list[dict[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(holding_by_team(self.database_url, self.pool))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_three_teams_share_two_slots_by_fair_share_within_quotas(
        processes, tiny_spec, job_of, wait_for, wait_worker_ready, pool, database_url, api):
    alpha = team(database_url, f"alpha-{pool}", weight=2.0, quota=(pool, 1))
    beta = team(database_url, f"beta-{pool}")
    gamma = team(database_url, f"gamma-{pool}")
    hold(database_url, pool, True)  # everything is queued before the first decision
    spec = lambda name, **kw: tiny_spec(name, pool=pool, grpo={"max_steps": 2}, **kw)  # noqa: E731
    jobs = {name: submit_as(database_url, owner, spec(name))
            for name, owner in (("a1", alpha), ("a2", alpha), ("b1", beta), ("b2", beta),
                                ("c1", gamma), ("c2", gamma))}
    jobs["b-high"] = submit_as(database_url, beta, spec("b-high", priority="high"))
    team_of = {job_id: name[0] for name, job_id in jobs.items()}

    processes.worker(pool)
    processes.worker(pool)
    wait_worker_ready(pool, processes, count=2)
    processes.scheduler()
    wait_for(lambda: all(job_of(j).pending_reason == "pool_held" for j in jobs.values()), 30,
             "every job to wait with pending_reason pool_held", processes)
    queue = api.get("/v1/queue", params={"pool": pool}).json()
    assert [entry["position"] for entry in queue["items"]] == list(range(1, len(jobs) + 1))
    assert queue["items"][0]["job_id"] == jobs["b-high"]  # priority first
    assert {entry["pending_reason"] for entry in queue["items"]} == {"pool_held"}
    assert api.get(f"/v1/jobs/{jobs['a1']}").json()["queue_position"] == queue["items"][1]["position"]

    with Sampler(database_url, pool) as sampler:
        hold(database_url, pool, False)
        wait_for(lambda: len(holding_by_team(database_url, pool)) == 2, 30, "two teams running", processes)
        cluster = api.get("/v1/cluster").json()
        ours = next(p for p in cluster["pools"] if p["name"] == pool)
        assert (ours["gpus_total"], len(ours["workers"])) == (2, 2)
        alpha_view = next(t for t in cluster["teams"] if t["team_id"] == alpha)["pools"][pool]
        assert alpha_view["quota"] == 1 and alpha_view["held_gpus"] <= 1
        assert {r["job_id"] for r in cluster["running"] if r["pool"] == pool} <= set(jobs.values())
        wait_for(lambda: all(job_of(j).status in TERMINAL_STATUSES for j in jobs.values()), 240,
                 "every job to finish", processes, interval=0.5)

    assert {job_of(j).status for j in jobs.values()} == {"succeeded"}
    assert sampler.samples and all(sum(s.values()) <= 2 for s in sampler.samples)  # two slots
    assert all(s.get(alpha, 0) <= 1 for s in sampler.samples)  # alpha's quota, at every moment
    order = dispatch_order(database_url, list(jobs.values()))
    assert len(order) == len(jobs)  # each dispatched once
    assert order[0] == jobs["b-high"]
    # Fair share, not FIFO: the first three dispatches go to three different teams (FIFO with
    # alpha's quota would start a1, b1, b2), and each team's own jobs run oldest first.
    assert {team_of[j] for j in order[:3]} == {"a", "b", "c"}
    for prefix in "abc":
        mine = [j for j in order if team_of[j] == prefix and j != jobs["b-high"]]
        assert mine == sorted(mine)


def test_a_high_job_preempts_an_over_share_job_which_resumes_from_its_checkpoint(
        processes, tiny_spec, job_of, wait_for, wait_worker_ready, pool, database_url):
    owner = team(database_url, f"owner-{pool}")
    urgent = team(database_url, f"urgent-{pool}", quota=(pool, 1))
    long_job = submit_as(database_url, owner, tiny_spec("long", pool=pool, priority="low",
                                                         grpo={"max_steps": 30}, checkpoint_every=50))
    processes.worker(pool)
    wait_worker_ready(pool, processes)
    processes.scheduler()
    wait_for(lambda: job_of(long_job).last_step >= 2, 120, "the long job to train a little", processes,
             interval=0.05)

    high = submit_as(database_url, urgent, tiny_spec("urgent", pool=pool, priority="high",
                                                     grpo={"max_steps": 2}))
    preempted = wait_for(lambda: (job := job_of(long_job)).status == "preempted" and job, 60,
                         "the long job to yield", processes, interval=0.05)
    assert preempted.worker_id is None and preempted.latest_checkpoint  # it checkpointed on the way out
    stopped_at = preempted.last_step
    assert 2 <= stopped_at < 30
    wait_for(lambda: job_of(high).status == "succeeded", 120, "the urgent job to run", processes)
    done = wait_for(lambda: (job := job_of(long_job)).status in TERMINAL_STATUSES and job, 180,
                    "the long job to resume and finish", processes, interval=0.5)

    assert done.status == "succeeded", done.error
    assert done.attempt == 2
    assert job_of(high).finished_at <= done.started_at  # the urgent job ran in between
    with session_scope(database_url) as session:
        steps = [m.step for m in list_metrics(session, long_job, limit=1000)]
        kinds = [e.type for e in list_events(session, long_job, limit=1000)]
        resumed = [e for e in list_events(session, long_job, limit=1000) if e.type == "resumed"]
    assert steps == list(range(1, 31))  # continuous: no step missing or duplicated
    assert kinds.index("preempt_requested") < kinds.index("preempted") < kinds.index("resumed")
    assert [e.data["step"] for e in resumed] == [stopped_at]
