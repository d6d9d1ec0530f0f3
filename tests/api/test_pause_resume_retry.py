"""Pause, resume and retry over real HTTP (Postgres and SQLite), with the worker's own store calls
standing in for a worker: what each does from each status, the GPUs a paused job gives back, a
retried job's fresh attempt budget, team scoping and the CLI verbs. Through a real worker and
its checkpoints: tests/e2e/test_service.py."""

from __future__ import annotations

from pathlib import Path

from api.cli.main import main
from api.store.attempts import requeue_after_fault, stop_paused, stop_request
from api.store.db import session_scope
from api.store.jobs import request_pause
from api.store.tables import Allocation, Job


def post(client, job_id: int, action: str):
    return client.post(f"/v1/jobs/{job_id}/{action}")


def test_a_waiting_job_pauses_at_once_and_resumes_into_the_queue(alpha, beta, job_spec) -> None:
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    paused = post(alpha, job["id"], "pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert post(alpha, job["id"], "pause").json()["status"] == "paused"  # again: no change
    assert post(beta, job["id"], "pause").status_code == 404
    assert post(alpha, job["id"], "retry").status_code == 409
    resumed = post(alpha, job["id"], "resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    refused = post(alpha, job["id"], "resume")
    assert refused.status_code == 409 and "not paused" in refused.json()["error"]["message"]
    post(alpha, job["id"], "pause")
    cancelled = alpha.post(f"/v1/jobs/{job['id']}/cancel").json()  # a paused job cancels
    assert cancelled["status"] == "cancelled"


def test_a_running_job_pauses_at_its_next_step_and_frees_its_gpus(alpha, job_spec, worker,
                                                                   api_server) -> None:
    url = api_server.settings.database_url
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    worker.start(job["id"])
    worker.step(job["id"], 1)
    assert post(alpha, job["id"], "pause").json()["status"] == "pausing"
    with session_scope(url) as session:
        assert stop_request(session, job["id"]) == "pause"  # what the job's process reads each step
        assert stop_paused(session, job["id"], "scripted", 1)
    read = alpha.get(f"/v1/jobs/{job['id']}").json()
    assert (read["status"], read["worker_id"], read["devices"]) == ("paused", None, None)
    with session_scope(url) as session:
        open_allocations = session.query(Allocation).filter(Allocation.job_id == job["id"],
                                                            Allocation.ended_at.is_(None)).count()
    assert open_allocations == 0
    events = [e["type"] for e in alpha.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
    assert events[-2:] == ["pause_requested", "paused"]
    assert post(alpha, job["id"], "resume").json()["status"] == "queued"


def test_a_fault_while_pausing_leaves_it_paused(alpha, job_spec, worker, api_server) -> None:
    url = api_server.settings.database_url
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    worker.start(job["id"])
    with session_scope(url) as session:
        request_pause(session, job["id"])
        moved = requeue_after_fault(session, job["id"], worker_id="scripted", message="rank died", data={},
                                    max_attempts=5)
    assert moved.status == "paused"


def test_retry_requeues_a_failed_job_with_its_error_cleared_and_a_fresh_budget(alpha, job_spec, worker,
                                                                               api_server) -> None:
    url = api_server.settings.database_url
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    worker.start(job["id"])
    worker.finish(job["id"], "failed")
    with session_scope(url) as session:  # as if it had used up its attempts
        session.query(Job).filter(Job.id == job["id"]).update({"attempt": 5})
    retried = post(alpha, job["id"], "retry")
    assert retried.status_code == 200, retried.text
    body = retried.json()
    assert (body["status"], body["error"], body["finished_at"]) == ("queued", None, None)
    assert post(alpha, job["id"], "retry").status_code == 409
    worker.start(job["id"])  # attempt 6, the first since the retry: a fault requeues it
    with session_scope(url) as session:
        moved = requeue_after_fault(session, job["id"], worker_id="scripted", message="rank died", data={},
                                    max_attempts=5)
    assert moved.status == "queued"


def test_the_cli_verbs(alpha, job_spec, api_server, team_keys, capsys) -> None:
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    argv = ["--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    assert main(["pause", str(job["id"]), *argv]) == 0
    assert f"job {job['id']} paused" in capsys.readouterr().out
    assert main(["resume", str(job["id"]), *argv]) == 0
    assert "queued (it has no checkpoint: it starts from step 0)" in capsys.readouterr().out
    assert main(["retry", str(job["id"]), *argv]) == 2  # not failed: a 409
    assert "only a failed or cancelled job can be retried" in capsys.readouterr().err


def test_retry_says_whether_the_job_continues_from_a_checkpoint_or_starts_over(alpha, job_spec, worker,
                                                                               api_server, team_keys,
                                                                               capsys) -> None:
    argv = ["--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    bare, kept = (alpha.post("/v1/jobs", json=job_spec()).json()["id"] for _ in range(2))
    for job_id in (bare, kept):
        worker.start(job_id)
        for step in (1, 2, 3):
            worker.step(job_id, step)
            if job_id == kept and step == 2:
                worker.reporter(kept).on_checkpoint(2, Path("/artifacts/jobs/kept/step-2"))
        worker.finish(job_id, "failed")
    capsys.readouterr()
    assert main(["retry", str(bare), *argv]) == 0
    assert capsys.readouterr().out == \
        f"job {bare} queued (it has no checkpoint: it starts over from step 0; steps 1-3 run again)\n"
    assert main(["retry", str(kept), *argv]) == 0
    assert capsys.readouterr().out == f"job {kept} queued (it continues from its checkpoint step-2)\n"
