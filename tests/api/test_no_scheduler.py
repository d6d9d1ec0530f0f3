"""No scheduler running: a waiting job says ``no_scheduler`` (in its read, the job list and the
queue view) instead of a reason from a pass long gone, and ``/readyz`` says ``degraded`` with the
age of the last pass. The passes are real (``Scheduler.tick`` over the test database); the one
"long ago" is the scheduler's own stamp, written with an old time.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis

from api.scheduling import liveness
from api.scheduling.scheduler import Scheduler
from api.store import bus
from api.store.tables import utcnow


@pytest.fixture
def redis_client(api_server):
    client = redis.Redis.from_url(api_server.settings.redis_url)
    client.delete(api_server.settings.redis_keys.scheduler_pass)  # no scheduler has ever passed
    yield client
    client.close()


def pass_long_ago(client, settings) -> None:
    """The stamp a scheduler left when it last passed, before it stopped."""
    stamp = utcnow() - timedelta(seconds=liveness.stale_after_seconds(settings) + 60)
    bus.mark_scheduler_pass(client, settings.redis_keys, stamp.isoformat())


def test_a_waiting_job_says_no_scheduler_until_a_scheduler_passes(api, api_server, redis_client, job_spec,
                                                                   pool) -> None:
    settings = api_server.settings
    job = api.post("/v1/jobs", json=job_spec(resources={"pool": pool})).json()
    assert job["status"] == "queued"
    read = api.get(f"/v1/jobs/{job['id']}").json()
    assert read["pending_reason"] == "no_scheduler"
    listed = {item["id"]: item for item in api.get("/v1/jobs", params={"status": "queued"}).json()["items"]}
    assert listed[job["id"]]["pending_reason"] == "no_scheduler"

    Scheduler(settings).tick()  # a live scheduler: no worker serves the pool
    read = api.get(f"/v1/jobs/{job['id']}").json()
    assert (read["pending_reason"], read["queue_position"]) == ("no_workers", 1)
    [entry] = api.get("/v1/queue", params={"pool": pool}).json()["items"]
    assert entry["pending_reason"] == "no_workers"

    pass_long_ago(redis_client, settings)  # then it stopped
    read = api.get(f"/v1/jobs/{job['id']}").json()
    assert read["pending_reason"] == "no_scheduler"
    assert read["queue_position"] == 1  # its last published order is still shown
    [entry] = api.get("/v1/queue", params={"pool": pool}).json()["items"]
    assert entry["pending_reason"] == "no_scheduler"
    api.post(f"/v1/jobs/{job['id']}/cancel")
    cancelled = api.get(f"/v1/jobs/{job['id']}").json()
    assert cancelled["status"] == "cancelled" and cancelled["pending_reason"] != "no_scheduler"


def test_readyz_reports_the_age_of_the_last_scheduler_pass(api, api_server, redis_client) -> None:
    settings = api_server.settings
    never = api.get("/readyz")
    assert never.status_code == 200  # this API serves: degraded, not out of a load balancer
    assert never.json()["status"] == "degraded"
    assert never.json()["checks"]["scheduler"] == "no scheduler pass yet"
    assert never.json()["scheduler"]["last_pass_age_seconds"] is None

    Scheduler(settings).tick()
    ready = api.get("/readyz").json()
    assert ready["status"] == "ready" and ready["checks"]["scheduler"] == "ok"
    assert 0 <= ready["scheduler"]["last_pass_age_seconds"] <= ready["scheduler"]["stale_after_seconds"]

    pass_long_ago(redis_client, settings)
    stale = api.get("/readyz")
    assert stale.status_code == 200 and stale.json()["status"] == "degraded"
    age = stale.json()["scheduler"]["last_pass_age_seconds"]
    assert age > liveness.stale_after_seconds(settings) + 59
    assert stale.json()["checks"]["scheduler"] == f"no pass for {age:.0f} s"


def test_a_scheduler_is_alive_only_within_twice_its_lock_lifetime(api_settings_factory) -> None:
    settings = api_settings_factory("sqlite:///never-opened.db", scheduler_interval_seconds=2.0)
    assert liveness.leader_ttl_seconds(settings) == 20.0 and liveness.stale_after_seconds(settings) == 40.0
    now = utcnow()
    assert liveness.pass_age_seconds(None) is None
    assert liveness.pass_age_seconds((now - timedelta(seconds=3)).isoformat().encode(), now) == 3.0
    assert liveness.pass_age_seconds((now + timedelta(seconds=3)).isoformat(), now) == 0.0  # a clock ahead
    assert liveness.scheduler_alive(40.0, settings) and not liveness.scheduler_alive(40.5, settings)
    assert not liveness.scheduler_alive(None, settings)
