"""The scheduling surface of the API: submit-time placement checks, ``PATCH /v1/jobs/{id}``,
``GET /v1/queue`` and ``GET /v1/cluster``, each scoped to the caller's team.

The queue and cluster views are fed by a real scheduler pass (``Scheduler.tick``) over the test
database, with worker heartbeats advertised the way a worker does (``api.store.bus.advertise_worker``).
"""

from __future__ import annotations

import pytest
import redis

from api.scheduling.scheduler import Scheduler
from api.store.db import session_scope
from api.store.pools import PoolSize, ensure_pool, set_size
from api.store.tables import Job
from api.vocabulary import Heartbeat


def error_of(response) -> dict:
    return response.json()["error"]


def test_a_submission_must_fit_a_known_pool(client_for, team_keys, job_spec, api_server) -> None:
    alpha = client_for(team_keys.alpha)
    before = alpha.get("/v1/jobs").json()["items"]
    unknown = alpha.post("/v1/jobs", json=job_spec(resources={"pool": "nosuchpool"}))
    assert unknown.status_code == 422
    assert error_of(unknown)["param"] == "resources.pool" and "default" in error_of(unknown)["message"]
    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, "twogpu")
        set_size(session, "twogpu", PoolSize(largest_worker=2, total=2))  # one 2-GPU worker
    too_big = alpha.post("/v1/jobs", json=job_spec(resources={"pool": "twogpu", "gpus": 3},
                                                    grpo={"prompts_per_step": 3}))
    assert too_big.status_code == 422 and error_of(too_big)["param"] == "resources.gpus"
    assert "have 2 together" in error_of(too_big)["message"]  # the whole pool (see test_gang_views)
    uneven = alpha.post("/v1/jobs", json=job_spec(resources={"pool": "twogpu", "gpus": 2},
                                                  grpo={"prompts_per_step": 3}))
    assert uneven.status_code == 422 and error_of(uneven)["param"] == "grpo.prompts_per_step"
    assert "resources.gpus (2)" in error_of(uneven)["message"]
    for bad, param in (({"pool": "twogpu", "gpus": 0}, "resources.gpus"),):
        response = alpha.post("/v1/jobs", json=job_spec(resources=bad))
        assert response.status_code == 422 and error_of(response)["param"] == param
    wrong_class = alpha.post("/v1/jobs", json=job_spec(priority="urgent"))
    assert wrong_class.status_code == 422 and error_of(wrong_class)["param"] == "priority"
    assert alpha.get("/v1/jobs").json()["items"] == before  # nothing was written
    fits = alpha.post("/v1/jobs", json=job_spec(resources={"pool": "twogpu", "gpus": 2}))
    assert fits.status_code == 201 and fits.json()["gpus"] == 2


def test_a_pool_a_live_worker_advertises_is_known_before_the_scheduler_records_it(
        client_for, team_keys, job_spec, advertise, api_server) -> None:
    """A worker of a new pool has just advertised and no scheduler pass has run yet: a
    submission naming that pool is accepted (not 'unknown pool') and the pool is recorded with
    the size its live workers offer, so the size check holds from the first job."""
    import uuid

    alpha = client_for(team_keys.alpha)
    pool = f"fresh{uuid.uuid4().hex[:6]}"
    advertise(pool, gpus=2)
    too_big = alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 3},
                                                    grpo={"prompts_per_step": 3}))
    assert too_big.status_code == 422 and error_of(too_big)["param"] == "resources.gpus", too_big.text
    fits = alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 2}))
    assert fits.status_code == 201, fits.text
    with session_scope(api_server.settings.database_url) as session:
        from api.store.pools import get_pool
        recorded = get_pool(session, pool)
    assert (recorded.max_worker_gpus, recorded.total_gpus) == (2, 2)


def test_priority_changes_live_and_only_while_the_job_is_not_finished(client_for, team_keys, job_spec,
                                                                       worker) -> None:
    alpha, admin = client_for(team_keys.alpha), client_for(team_keys.admin)
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    changed = admin.patch(f"/v1/jobs/{job['id']}", json={"priority": "high"})  # above a member's class
    assert changed.status_code == 200 and changed.json()["priority"] == "high"
    events = alpha.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    assert events[-1]["type"] == "priority_changed" and events[-1]["data"] == {"from": "normal", "to": "high"}
    for body, param in (({"priority": "urgent"}, "priority"), ({"priority": "low", "gpus": 2}, "gpus"),
                        ({}, None)):
        refused = alpha.patch(f"/v1/jobs/{job['id']}", json=body)
        assert refused.status_code == 422
        if param:
            assert error_of(refused)["param"] == param
    assert alpha.get(f"/v1/jobs/{job['id']}").json()["priority"] == "high"  # nothing changed
    worker.start(job["id"])
    worker.finish(job["id"])
    finished = alpha.patch(f"/v1/jobs/{job['id']}", json={"priority": "low"})
    assert finished.status_code == 409


def test_queue_and_cluster_show_the_schedulers_order_scoped_to_the_team(
        client_for, team_keys, job_spec, api_server, pool, advertise) -> None:
    alpha, beta, admin = (client_for(key) for key in (team_keys.alpha, team_keys.beta, team_keys.admin))
    spec = job_spec(resources={"pool": pool})
    a1, a2 = (alpha.post("/v1/jobs", json=spec).json()["id"] for _ in range(2))
    b1 = beta.post("/v1/jobs", json=spec).json()["id"]
    worker_id = advertise(pool)
    scheduler = Scheduler(api_server.settings)
    assert [j for j in scheduler.tick() if j in (a1, a2, b1)] == [a1]  # oldest of the tied teams

    everyone = admin.get("/v1/queue", params={"pool": pool}).json()
    assert [(e["job_id"], e["position"]) for e in everyone["items"]] == [(b1, 1), (a2, 2)]  # beta's turn
    assert [e["pending_reason"] for e in everyone["items"]] == ["fair_share", "fair_share"]
    assert everyone["waiting"] == {pool: 2} and everyone["scheduler_pass_at"]
    mine = alpha.get("/v1/queue", params={"pool": pool}).json()
    assert [e["job_id"] for e in mine["items"]] == [a2] and mine["waiting"] == {pool: 2}
    assert [e["job_id"] for e in beta.get("/v1/queue", params={"pool": pool}).json()["items"]] == [b1]
    waiting = alpha.get(f"/v1/jobs/{a2}").json()
    assert (waiting["pending_reason"], waiting["queue_position"]) == ("fair_share", 2)
    running = alpha.get(f"/v1/jobs/{a1}").json()
    assert running["status"] == "dispatched" and running["worker_id"] == worker_id
    assert running["devices"] == [0]  # recorded with the dispatch: the worker's only device
    assert running["pending_reason"] is None and running["queue_position"] is None

    cluster = alpha.get("/v1/cluster").json()
    ours = next(p for p in cluster["pools"] if p["name"] == pool)
    assert (ours["gpus_total"], ours["gpus_busy"], ours["gpus_free"], ours["waiting"]) == (1, 1, 0, 2)
    [seen] = ours["workers"]
    assert (seen["worker_id"], seen["gpu_model"], seen["gpu_memory_mb"], seen["devices"]) == (
        worker_id, "H200", 143771, [{"index": 0, "busy": True, "job_id": a1}])
    assert [(r["job_id"], r["devices"]) for r in cluster["running"] if r["pool"] == pool] == [(a1, [0])]
    usage = {t["team"]: t["pools"].get(pool) for t in cluster["teams"]}
    assert usage["alpha"]["held_gpus"] == 1 and usage["alpha"]["fair_share"] == pytest.approx(0.5)
    assert usage["beta"]["held_gpus"] == 0 and usage["beta"]["waiting"] == 1

    # Beta sees the pool and every team's usage, but not alpha's job.
    theirs = beta.get("/v1/cluster").json()
    [seen] = next(p for p in theirs["pools"] if p["name"] == pool)["workers"]
    assert seen["devices"] == [{"index": 0, "busy": True, "job_id": None}] and seen["busy"]
    assert all(r["job_id"] != a1 for r in theirs["running"])


def test_a_job_is_placed_only_on_a_worker_that_advertises_what_its_rewards_need(
        api, api_server, job_spec, pool, advertise) -> None:
    """Two live workers in one pool, one with the sandbox: code_tests jobs go to that one only,
    and wait for it (``no_capable_worker`` once it left) while the other stays free."""
    rows = [{"prompt": "Read n and print 2n.", "tests": [{"input": "2", "output": "4"}]}]
    code = job_spec(resources={"pool": pool}, dataset={"prompts": rows},
                    rewards=[{"name": "contains", "args": {"text": "x"}}, {"name": "code_tests"}])
    # The plain worker sorts first: best fit alone, among equals, would pick it.
    plain = advertise(pool, prefix="a-plain")
    sandboxed = advertise(pool, capabilities=("code_sandbox",), prefix="b-sandboxed")
    first, second = (api.post("/v1/jobs", json=code).json()["id"] for _ in range(2))
    scheduler = Scheduler(api_server.settings)
    assert [j for j in scheduler.tick() if j in (first, second)] == [first]
    assert api.get(f"/v1/jobs/{first}").json()["worker_id"] == sandboxed
    waiting = api.get(f"/v1/jobs/{second}").json()
    # The one worker it could use went to the job ahead of it; the free plain one does not count.
    assert (waiting["status"], waiting["pending_reason"]) == ("queued", "fair_share")
    with session_scope(api_server.settings.database_url) as session:
        assert session.get(Job, second).required_capabilities == ["code_sandbox"]

    client = redis.Redis.from_url(api_server.settings.redis_url)
    client.delete(api_server.settings.redis_keys.worker(sandboxed))  # it left (its heartbeat expired)
    client.close()
    plain_job = api.post("/v1/jobs", json=job_spec(resources={"pool": pool})).json()["id"]
    assert [j for j in scheduler.tick() if j in (second, plain_job)] == [plain_job]
    assert api.get(f"/v1/jobs/{plain_job}").json()["worker_id"] == plain
    entries = api.get("/v1/queue", params={"pool": pool}).json()["items"]
    assert [(e["job_id"], e["pending_reason"]) for e in entries] == [(second, "no_capable_worker")]


def test_a_retried_telemetry_write_is_reported_as_a_duplicate(api, api_server, job_spec) -> None:
    """Each (job, step) is written once; the store says which write took (on both backends)."""
    from api.store.telemetry import record_checkpoint, record_metrics, record_samples

    job_id = api.post("/v1/jobs", json=job_spec()).json()["id"]
    writes = (lambda s: record_metrics(s, job_id, {"step": 1}), lambda s: record_samples(s, job_id, 1, []),
              lambda s: record_checkpoint(s, job_id, 1, "/c", 1))
    with session_scope(api_server.settings.database_url) as session:
        assert [(write(session), write(session)) for write in writes] == [(True, False)] * 3


def test_a_packed_worker_shows_each_device_and_its_job_and_keeps_unknown_jobs_devices_busy() -> None:
    """Pure: heartbeats and SQL's holders as the scheduler reads them, no server."""
    from api.domain import cluster_state
    from api.scheduling import policy
    from api.scheduling.cluster_views import cluster_view
    from api.store.dispatching import SchedulingState, schedulable_workers

    # SQL gives w1 job 10 (team 1) on device 0 and job 11 (team 2) on device 2, dispatched but not
    # started; the worker's children run 10 and job 12, whose lease was lost, on device 3.
    holding = [cluster_state.HoldingJob(10, 1, "a", 1, "normal", "w1", "running", 0.0, devices=(0,)),
               cluster_state.HoldingJob(11, 2, "a", 1, "normal", "w1", "dispatched", 0.0, devices=(2,))]
    beat = Heartbeat(worker_id="w1", pool="a", gpus=4, jobs={10: [0], 12: [3]})
    [worker] = schedulable_workers([beat], holding)
    assert worker == cluster_state.Worker("w1", "a", 4, busy=(3,))  # 10's and 11's devices come from SQL
    waiting = (cluster_state.WaitingJob(20, 1, "a", 1, "normal"),)
    state = cluster_state.ClusterState((worker,), waiting, tuple(holding), {})
    assert policy.plan(state).dispatch == [policy.Dispatch(20, "w1", (1,))]

    scheduling = SchedulingState(state, {"a": (False, PoolSize(4, 4))}, {1: "alpha", 2: "beta"})

    def devices(scope: int | None) -> list[tuple[int, bool, int | None]]:
        view = cluster_view(scheduling, [beat], {}, scope)
        return [(d.index, d.busy, d.job_id) for d in view.pools[0].workers[0].devices]

    assert devices(None) == [(0, True, 10), (1, False, None), (2, True, 11), (3, True, 12)]
    assert devices(1) == [(0, True, 10), (1, False, None), (2, True, None), (3, True, None)]
    view = cluster_view(scheduling, [beat], {}, 1)
    assert (view.pools[0].gpus_busy, view.pools[0].gpus_free) == (3, 1)
    assert [(r.job_id, r.devices) for r in view.running] == [(10, [0])]


def test_only_a_waiting_job_says_why_it_waits(client_for, team_keys, job_spec, api_server, pool) -> None:
    """The scheduler's reason stays in SQL after a job stops waiting; the API no longer shows it."""
    alpha = client_for(team_keys.alpha)
    first, second = (alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool})).json()["id"]
                     for _ in range(2))
    Scheduler(api_server.settings).tick()  # the pool has no worker: both wait, saying so
    assert [alpha.get(f"/v1/jobs/{job}").json()["pending_reason"] for job in (first, second)] == \
        ["no_workers", "no_workers"]
    cancelled = alpha.post(f"/v1/jobs/{first}/cancel").json()
    paused = alpha.post(f"/v1/jobs/{second}/pause").json()
    assert (cancelled["status"], cancelled["pending_reason"]) == ("cancelled", None)
    assert (paused["status"], paused["pending_reason"]) == ("paused", None)
    listed = {job["id"]: job for job in alpha.get("/v1/jobs", params={"limit": 100}).json()["items"]}
    assert [listed[job]["pending_reason"] for job in (first, second)] == [None, None]
    assert alpha.get(f"/v1/jobs/{first}").json()["pending_reason"] is None
    resumed = alpha.post(f"/v1/jobs/{second}/resume").json()  # waiting again: its reason is the scheduler's
    Scheduler(api_server.settings).tick()
    assert (resumed["status"], alpha.get(f"/v1/jobs/{second}").json()["pending_reason"]) == \
        ("queued", "no_workers")
