"""``GET /metrics``: Prometheus' text format, admin only, with service-wide numbers read at
scrape time: jobs by status, queue length per pool, scheduler dispatches, each running job's
steps per second, live workers and GPUs, open job streams."""

from __future__ import annotations

import time
import uuid

import redis
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from api.scheduling.scheduler import Scheduler
from api.store import bus
from api.store.db import session_scope
from api.store.jobs import set_progress
from api.store.pools import ensure_pool
from api.store.telemetry import record_metrics
from api.vocabulary import worker_queue


def scrape(api) -> dict[tuple[str, tuple], float]:
    response = api.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def test_only_admins_may_scrape(client_for, team_keys) -> None:
    assert client_for(None).get("/metrics").status_code == 401
    assert client_for(team_keys.alpha).get("/metrics").status_code == 403
    assert client_for(team_keys.admin).get("/metrics").status_code == 200


def test_the_scrape_reports_queue_dispatches_running_jobs_and_streams(api, api_server, job_spec,
                                                                      worker) -> None:
    pool = f"m{uuid.uuid4().hex[:8]}"
    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, pool)
    first, second, third = (api.post("/v1/jobs", json=job_spec(resources={"pool": pool})).json()["id"]
                            for _ in range(3))
    before = scrape(api)
    assert before[("grpo_queue_length", (("pool", pool),))] == 3
    assert before[("grpo_jobs", (("status", "queued"),))] >= 3
    assert before[("grpo_jobs", (("status", "preempted"),))] >= 0  # every status is present

    client = redis.Redis.from_url(api_server.settings.redis_url)
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    bus.advertise_worker(client, worker_id, {"worker_id": worker_id, "pool": pool, "gpus": 2}, 60)
    try:
        assert first in Scheduler(api_server.settings).tick()
        worker.start(second)  # a second "worker" runs another job: 0.5 s per step
        with session_scope(api_server.settings.database_url) as session:
            for step in (1, 2):
                record_metrics(session, second, {"step": step, "step_time": 0.5, "reward": 0.1})
            set_progress(session, second, 2)
        with connect(f"{api_server.ws_url}/v1/jobs/{second}/stream", proxy=None, open_timeout=5,
                     additional_headers={"Authorization": api.headers["Authorization"]}) as ws:
            ws.recv(timeout=5)
            time.sleep(0.2)  # the hub registers the subscriber once the backlog is sent
            after = scrape(api)
    finally:
        client.delete(bus.worker_key(worker_id), worker_queue(worker_id))
        client.close()

    assert after[("grpo_queue_length", (("pool", pool),))] == 1  # third waits
    assert after[("grpo_dispatches_total", ())] >= before[("grpo_dispatches_total", ())] + 1
    labels = (("job_id", str(second)), ("pool", pool), ("team", "default"))
    assert after[("grpo_job_steps_per_second", labels)] == 2.0
    assert after[("grpo_job_step", labels)] == 2
    assert all(dict(key[1]).get("job_id") != str(third) for key in after)  # only running jobs get a label
    assert after[("grpo_workers", (("pool", pool),))] == 1
    assert after[("grpo_gpus", (("pool", pool), ("state", "free")))] == 2
    assert after[("grpo_stream_subscribers", ())] >= 1
    assert after[("grpo_scheduler_pass_age_seconds", ())] < 60
