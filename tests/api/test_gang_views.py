"""Jobs that span hosts (gangs) as the API and its clients show them: a submission is bounded by
the GPUs of the pool's live workers together (recorded by the scheduler from their heartbeats),
not by its largest worker; a gang is one job in the cluster view, on the job's page and in the
CLI's text, with each worker naming its share.

Live workers are heartbeats advertised the way a worker does (the ``advertise`` fixture);
a gang's placement is written to SQL as the scheduler's dispatch records it
(``[{"worker": id, "devices": [...]}]``, node-rank order).
"""

from __future__ import annotations

import uuid

from sqlalchemy import update

from api.cli import term_view as tv
from api.cli.cluster_view import cluster_lines
from api.domain import cluster_state
from api.scheduling.cluster_views import cluster_view
from api.scheduling.scheduler import Scheduler
from api.store.db import session_scope
from api.store.dispatching import SchedulingState
from api.store.pools import PoolSize, ensure_pool, get_pool, set_size
from api.store.tables import Job
from api.vocabulary import Heartbeat


def refusal(response) -> dict:
    assert response.status_code == 422, response.text
    return response.json()["error"]


def test_a_job_larger_than_any_one_worker_is_accepted_up_to_the_pools_total(
        alpha, client_for, team_keys, api_server, job_spec, pool, advertise) -> None:
    advertise(pool, 2)
    advertise(pool, 1)
    Scheduler(api_server.settings).tick()  # records the pool's size from the heartbeats
    pools = client_for(team_keys.admin).get("/v1/admin/pools").json()["items"]
    [recorded] = [p for p in pools if p["name"] == pool]
    assert (recorded["max_worker_gpus"], recorded["total_gpus"]) == (2, 3)

    spanning = alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 3},
                                                     grpo={"prompts_per_step": 3}))
    assert spanning.status_code == 201 and spanning.json()["gpus"] == 3
    too_big = refusal(alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 4},
                                                            grpo={"prompts_per_step": 4})))
    assert too_big["param"] == "resources.gpus"
    assert too_big["message"] == (
        f"resources.gpus: asks for 4 GPUs but the live workers of pool '{pool}' have 3 together, its "
        "largest worker 2; a job larger than the largest worker runs across several workers")
    uneven = refusal(alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 3},
                                                          grpo={"prompts_per_step": 4})))
    assert uneven["param"] == "grpo.prompts_per_step"  # each rank still trains on whole groups

    advertise(pool, 2)  # a worker joins: the bound grows with the next pass, and only its total changed
    Scheduler(api_server.settings).tick()
    with session_scope(api_server.settings.database_url) as session:
        assert (get_pool(session, pool).max_worker_gpus, get_pool(session, pool).total_gpus) == (2, 5)
    grown = alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 4},
                                                  grpo={"prompts_per_step": 4}))
    assert grown.status_code == 201


def test_a_pool_recorded_before_totals_is_bounded_by_its_largest_worker(alpha, api_server, job_spec) -> None:
    name = f"old{uuid.uuid4().hex[:6]}"
    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, name)
        set_size(session, name, PoolSize(largest_worker=2, total=None))
    error = refusal(alpha.post("/v1/jobs", json=job_spec(resources={"pool": name, "gpus": 3},
                                                          grpo={"prompts_per_step": 3})))
    assert error["param"] == "resources.gpus"
    assert error["message"] == (f"resources.gpus: asks for 3 GPUs but the largest worker of pool '{name}' "
                                "has 2")


def hold_as_gang(settings, job_id: int, placement: list[dict]) -> None:
    """The job running on every host of ``placement``, as a dispatch records it."""
    node0 = placement[0]
    with session_scope(settings.database_url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(
            status="running", worker_id=node0["worker"], devices=node0["devices"], placement=placement,
            attempt=1))


def test_a_jobs_read_shows_every_worker_it_spans(alpha, api_server, job_spec, pool, advertise) -> None:
    first, second = advertise(pool, 2), advertise(pool, 1)
    job = alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 3},
                                                grpo={"prompts_per_step": 3})).json()
    assert job["placement"] == []  # holds nothing while it waits
    placement = [{"worker": first, "devices": [0, 1]}, {"worker": second, "devices": [0]}]
    hold_as_gang(api_server.settings, job["id"], placement)

    read = alpha.get(f"/v1/jobs/{job['id']}").json()
    assert read["placement"] == placement and (read["worker_id"], read["devices"]) == (first, [0, 1])
    listing = alpha.get("/v1/jobs", params={"limit": 100}).json()["items"]
    [listed] = [j for j in listing if j["id"] == job["id"]]
    assert listed["placement"] == placement  # lists load it too
    schemas = alpha.get("/openapi.json").json()["components"]["schemas"]
    placed = schemas["JobRead"]["properties"]["placement"]
    assert placed["items"] == {"$ref": "#/components/schemas/HostPlacement"}
    assert set(schemas["HostPlacement"]["properties"]) == {"worker", "devices"}

    # grpo show, from the API's answer
    assert tv.job_details(read)[1] == f"status      running (attempt 1, workers {first} [0,1] + {second} [0])"
    single = {**read, "placement": placement[:1]}
    assert tv.job_details(single)[1] == f"status      running (attempt 1, worker {first} [0,1])"
    assert tv.placement_text([{"worker": "w9", "devices": None}]) == "w9"  # dispatched before devices


def gang_state(pool: str) -> tuple[SchedulingState, list[Heartbeat]]:
    """Job 7 (team 1, alpha) spans w1 (devices 0 and 1, node 0) and w2 (device 0); job 8 (team 2,
    beta) runs on w2's device 1. w2's heartbeat does not report job 7 yet: SQL says it is there."""
    gang = cluster_state.HoldingJob(7, 1, pool, 3, "normal", "w1", "running", 0.0, devices=(0, 1),
                                    gang=(cluster_state.Share("w2", (0,)),))
    other = cluster_state.HoldingJob(8, 2, pool, 1, "normal", "w2", "running", 0.0, devices=(1,))
    beats = [Heartbeat(worker_id="w1", pool=pool, gpus=2, jobs={7: [0, 1]}),
             Heartbeat(worker_id="w2", pool=pool, gpus=2, jobs={8: [1]})]
    workers = tuple(cluster_state.Worker(b.worker_id, pool, b.gpus) for b in beats)
    state = cluster_state.ClusterState(workers, (), (gang, other), {})
    return SchedulingState(state, {pool: (False, PoolSize(2, 4))}, {1: "alpha", 2: "beta"}), beats


def test_a_gang_is_one_running_job_and_each_worker_shows_its_share() -> None:
    """Pure: the view over the scheduler's state (``HoldingJob.gang`` is ``jobs.placement``)."""
    state, beats = gang_state("a")
    view = cluster_view(state, beats, {}, scope=None)
    [gang, other] = view.running
    assert (gang.job_id, gang.gpus, gang.worker_id, gang.devices) == (7, 3, "w1", [0, 1])
    assert [h.model_dump() for h in gang.placement] == [{"worker": "w1", "devices": [0, 1]},
                                                        {"worker": "w2", "devices": [0]}]
    assert [h.model_dump() for h in other.placement] == [{"worker": "w2", "devices": [1]}]
    [pool] = view.pools
    w1, w2 = pool.workers
    assert [(d.index, d.job_id) for d in w2.devices] == [(0, 7), (1, 8)]  # the follower's share is busy
    assert [g.model_dump() for g in w1.gangs] == [{"job_id": 7, "node_rank": 0, "hosts": 2,
                                                   "devices": [0, 1]}]
    assert [g.model_dump() for g in w2.gangs] == [{"job_id": 7, "node_rank": 1, "hosts": 2,
                                                   "devices": [0]}]
    assert (pool.gpus_total, pool.gpus_busy, pool.gpus_free) == (4, 4, 0)

    # A member of the other team sees the devices busy, not the job nor its shares.
    theirs = cluster_view(state, beats, {}, scope=2)
    assert [r.job_id for r in theirs.running] == [8]
    w1, w2 = theirs.pools[0].workers
    assert [(d.busy, d.job_id) for d in w2.devices] == [(True, None), (True, 8)]
    assert w1.gangs == [] and w2.gangs == []

    lines = cluster_lines(view.model_dump(mode="json"), {"updated_at": None, "scheduler_pass_at": None,
                                                         "waiting": {}, "items": []}, None)
    assert [line.split()[:7] for line in lines if line.startswith("w")] == [
        ["w1", "a", "2", "-", "-", "busy", "0:7(node"],
        ["w2", "a", "2", "-", "-", "busy", "0:7(node"]]
    assert [line for line in lines if line.startswith("w2")][0].split()[6:8] == ["0:7(node", "1/2),1:8"]
    running = lines[lines.index("Running") + 1:]
    assert running[0].split()[6:9] == ["WORKERS", "[DEVICES]", "PREEMPTING"]
    assert running[1].split()[:2] == ["7", "alpha"] and "w1 [0,1] + w2 [0]" in running[1]
    assert running[2].split()[:2] == ["8", "beta"] and "w2 [1]" in running[2]


def test_the_cluster_route_shows_a_gang_from_sql_once_with_each_workers_share(
        alpha, api_server, job_spec, pool, advertise) -> None:
    first, second = advertise(pool, 2), advertise(pool, 1)
    job_id = alpha.post("/v1/jobs", json=job_spec(resources={"pool": pool, "gpus": 3},
                                                   grpo={"prompts_per_step": 3})).json()["id"]
    placement = [{"worker": first, "devices": [0, 1]}, {"worker": second, "devices": [0]}]
    hold_as_gang(api_server.settings, job_id, placement)

    cluster = alpha.get("/v1/cluster").json()
    assert [(r["job_id"], r["gpus"], r["placement"]) for r in cluster["running"] if r["pool"] == pool] == [
        (job_id, 3, placement)]
    workers = {w["worker_id"]: w for p in cluster["pools"] if p["name"] == pool for w in p["workers"]}
    assert workers[second]["devices"] == [{"index": 0, "busy": True, "job_id": job_id}]
    assert [(g["job_id"], g["node_rank"], g["hosts"]) for g in workers[second]["gangs"]] == [(job_id, 1, 2)]
