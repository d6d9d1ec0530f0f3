"""Two whole stacks (a scheduler and a worker each, on databases of their own) share one Redis
and one pool name: each dispatches its own job onto its own worker and both finish. Without
namespaces one scheduler held the only leader lock, the other stack's jobs stayed queued, and
each scheduler saw both stacks' workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from service_db import fresh_postgres_url, migrated
from service_stack import settings_of

from api.domain.job_spec import JobSpec
from api.store.bus import live_workers
from api.store.db import session_scope
from api.store.jobs import create_job, get_job
from api.store.teams import DEFAULT_TEAM, team_id_by_name
from api.store.telemetry import list_metrics

STEPS = 3


@pytest.fixture(scope="module")
def other_database_url() -> Iterator[str]:
    with fresh_postgres_url("grpo_w2") as url, migrated(url):
        yield url


def submit_to(database_url: str, spec: dict) -> int:
    with session_scope(database_url) as session:
        job, _ = create_job(session, team_id_by_name(session, DEFAULT_TEAM), JobSpec.model_validate(spec))
    return job.id


def finished_in(database_url: str, job_id: int):
    with session_scope(database_url) as session:
        job = get_job(session, job_id)
    return job if job.status in ("succeeded", "failed", "cancelled") else None


def test_two_stacks_on_one_redis_each_dispatch_and_finish_their_own_job(
        processes, service_env, settings, database_url, other_database_url, redis_url, pool, tiny_spec,
        wait_for, tmp_path):
    # Its own artifacts too: both databases number their jobs from 1, and a job resumes from the
    # checkpoints it finds under its id.
    own = {"GRPO_DATABASE_URL": other_database_url, "GRPO_ARTIFACTS_ROOT": str(tmp_path)}
    other = settings_of({**service_env, **own})
    assert other.namespace != settings.namespace  # derived from the database: no setup needed
    for env in ({}, own):
        processes.worker(pool, **env)
        processes.scheduler(**env)
    client = redis.Redis.from_url(redis_url)

    def workers_of(stack) -> list[str]:
        return [beat.worker_id for beat in live_workers(client, stack.redis_keys) if beat.pool == pool]

    wait_for(lambda: len(workers_of(settings)) == 1 and len(workers_of(other)) == 1, 60,
             "each stack's worker to advertise", processes)
    [mine], [theirs] = workers_of(settings), workers_of(other)  # neither sees the other's worker

    jobs = {url: submit_to(url, tiny_spec(name, pool=pool, max_steps=STEPS))
            for url, name in ((database_url, "first"), (other_database_url, "second"))}
    for url, worker_id in ((database_url, mine), (other_database_url, theirs)):
        done = wait_for(lambda u=url: finished_in(u, jobs[u]), 120, f"the job of {url} to finish", processes)
        assert (done.status, done.worker_id, done.attempt) == ("succeeded", worker_id, 1), done.error
        with session_scope(url) as session:
            assert [m.step for m in list_metrics(session, jobs[url])] == list(range(1, STEPS + 1))
    leaders = {stack.redis_keys.scheduler_leader for stack in (settings, other)}
    assert len(leaders) == 2 and all(client.get(key) for key in leaders)  # each stack has its leader
