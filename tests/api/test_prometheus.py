"""``GET /metrics``: Prometheus' text format, admin only, with service-wide numbers read at
scrape time: jobs by status, queue length per pool, scheduler dispatches, each running job's
steps per second, live workers and GPUs, open job streams.

Every number is checked exactly against the state the test made. Jobs by status and the
counters are compared with a scrape taken before the test changed anything, so jobs, counters
and streams left by the module's other tests do not move the expected values."""

from __future__ import annotations

import time
import uuid

import redis
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until
from websockets.sync.client import connect

from api.domain.lifecycle import JOB_STATUSES
from api.scheduling.scheduler import Scheduler
from api.store import bus
from api.store.attempts import set_progress
from api.store.db import session_scope
from api.store.pools import ensure_pool
from api.store.telemetry import record_metrics
from api.vocabulary import Heartbeat

Samples = dict[tuple[str, tuple], float]


def scrape(api) -> Samples:
    response = api.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def jobs_by_status(samples: Samples) -> dict[str, float]:
    return {dict(labels)["status"]: value for (name, labels), value in samples.items() if name == "grpo_jobs"}


def moved(start: dict[str, float], **changes: int) -> dict[str, float]:
    """``start`` with each named status moved by its change."""
    return {status: count + changes.get(status, 0) for status, count in start.items()}


def job_labels(samples: Samples, name: str) -> set[str]:
    return {dict(labels)["job_id"] for (sample, labels), _ in samples.items() if sample == name}


def scrape_counting(api, streams: float) -> Samples:
    """The first scrape that counts ``streams`` open job streams (the hub counts a stream once
    its backlog is sent, a moment after the client's first message)."""
    def counted() -> Samples | None:
        samples = scrape(api)
        return samples if samples[("grpo_stream_subscribers", ())] == streams else None

    return wait_until(counted, 10, f"/metrics to count {streams:g} open stream(s)")


def test_only_admins_may_scrape(client_for, team_keys) -> None:
    assert client_for(None).get("/metrics").status_code == 401
    assert client_for(team_keys.alpha).get("/metrics").status_code == 403
    assert client_for(team_keys.admin).get("/metrics").status_code == 200


def test_the_scrape_reports_queue_dispatches_running_jobs_and_streams(api, api_server, job_spec,
                                                                      worker) -> None:
    pool = f"m{uuid.uuid4().hex[:8]}"
    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, pool)
    start = scrape(api)
    assert set(jobs_by_status(start)) == set(JOB_STATUSES)  # every status, even at zero
    assert ("grpo_queue_length", (("pool", pool),)) not in start  # an empty queue has no sample
    first, second, third = (api.post("/v1/jobs", json=job_spec(resources={"pool": pool})).json()["id"]
                            for _ in range(3))
    before = scrape(api)
    assert jobs_by_status(before) == moved(jobs_by_status(start), queued=3)
    assert before[("grpo_queue_length", (("pool", pool),))] == 3
    assert ("grpo_workers", (("pool", pool),)) not in before

    client = redis.Redis.from_url(api_server.settings.redis_url)
    keys = api_server.settings.redis_keys
    idle, busy = f"w-{uuid.uuid4().hex[:6]}", f"w-{uuid.uuid4().hex[:6]}"
    bus.advertise_worker(client, keys, Heartbeat(worker_id=idle, pool=pool, gpus=1), 60)
    try:
        ticked = time.monotonic()
        assert Scheduler(api_server.settings).tick() == [first]
        # A second worker runs another job on 2 of its 3 devices, at 0.5 s per step (it
        # heartbeats after the pass, so the scheduler never saw it).
        worker.start(second)
        beat = Heartbeat(worker_id=busy, pool=pool, gpus=3, jobs={second: [0, 2]})
        bus.advertise_worker(client, keys, beat, 60)
        with session_scope(api_server.settings.database_url) as session:
            for step in (1, 2):
                record_metrics(session, second, {"step": step, "step_time": 0.5, "reward": 0.1})
            set_progress(session, second, 2)
        streams = start[("grpo_stream_subscribers", ())]
        with connect(f"{api_server.ws_url}/v1/jobs/{second}/stream", proxy=None, open_timeout=5,
                     additional_headers={"Authorization": api.headers["Authorization"]}) as ws:
            ws.recv(timeout=5)
            after = scrape_counting(api, streams + 1)
            elapsed = time.monotonic() - ticked
        scrape_counting(api, streams)  # a closed stream is no longer counted
        # The scheduler's own counts in Redis, which the counters report since Redis started.
        counted = {name: int(client.get(keys.stat(name)) or 0) for name in bus.COUNTERS}
    finally:
        client.delete(keys.worker(idle), keys.worker(busy), keys.worker_queue(idle))
        client.close()

    assert jobs_by_status(after) == moved(jobs_by_status(start), queued=1, dispatched=1, running=1)
    assert after[("grpo_queue_length", (("pool", pool),))] == 1  # third waits
    assert after[("grpo_dispatches_total", ())] == before[("grpo_dispatches_total", ())] + 1
    assert after[("grpo_preemptions_total", ())] == before[("grpo_preemptions_total", ())]
    assert (after[("grpo_dispatches_total", ())], after[("grpo_preemptions_total", ())],
            after[("grpo_unclaimed_dispatches_total", ())]) == \
        (counted["dispatches"], counted["preemptions"], counted["unclaimed_dispatches"])
    labels = (("job_id", str(second)), ("pool", pool), ("team", "default"))
    assert after[("grpo_job_steps_per_second", labels)] == 2.0
    assert after[("grpo_job_step", labels)] == 2
    # Only running jobs get a label: not the dispatched first, nor the queued third.
    for name in ("grpo_job_step", "grpo_job_steps_per_second"):
        assert job_labels(after, name) == job_labels(start, name) | {str(second)}
    assert after[("grpo_steps_per_second", ())] == start[("grpo_steps_per_second", ())] + 2.0
    assert after[("grpo_workers", (("pool", pool),))] == 2
    # Device by device, as the heartbeats say: the idle worker's one and the busy one's device 1.
    assert after[("grpo_gpus", (("pool", pool), ("state", "free")))] == 2
    assert after[("grpo_gpus", (("pool", pool), ("state", "busy")))] == 2
    assert 0 <= after[("grpo_scheduler_pass_age_seconds", ())] <= elapsed
