"""A file (``DELETE /v1/files/{id}``) or a finished job (``DELETE /v1/jobs/{id}``) that another
job uses is kept (409 naming the user) while that job is in any status but a terminal one
(``api.domain.lifecycle.TERMINAL_STATUSES``): each user is held in its status by the store's own
transitions (the scheduler's dispatch, the worker's claim and yield, the API's cancel and pause).
A ``job:`` source counts however it was written that submit accepts (``job: 7``, ``job:07``), and
wherever the spec names it: ``model.source`` or a reward's model (a judge)."""

from __future__ import annotations

import pytest
from test_files import ROWS, uploaded
from test_job_deletion import write_artifacts

from api.domain.lifecycle import JOB_STATUSES, TERMINAL_STATUSES

UNFINISHED = [status for status in JOB_STATUSES if status not in TERMINAL_STATUSES]


def hold_in(status: str, client, worker, job_id: int) -> None:
    """Move a queued job to ``status`` the way the service does."""
    from api.store.db import session_scope
    from api.store.dispatching import dispatch_job, yield_preempted

    if status == "dispatched":
        with session_scope(worker.database_url, publish=worker.publish_staged) as session:
            assert dispatch_job(session, job_id, "scripted")
    elif status == "paused":
        assert client.post(f"/v1/jobs/{job_id}/pause").status_code == 200
    elif status != "queued":
        worker.start(job_id)
        if status == "cancelling":
            assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
        elif status == "pausing":
            assert client.post(f"/v1/jobs/{job_id}/pause").status_code == 200
        elif status == "preempted":
            with session_scope(worker.database_url, publish=worker.publish_staged) as session:
                assert yield_preempted(session, job_id, "scripted", step=1)
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == status


def submitted(client, spec) -> int:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_every_unfinished_status_is_covered() -> None:
    assert set(UNFINISHED) == {"queued", "dispatched", "running", "cancelling", "preempted", "pausing",
                               "paused"}


@pytest.mark.parametrize("status", UNFINISHED)
def test_a_file_is_kept_while_a_job_using_it_is_unfinished(alpha, job_spec, worker, status) -> None:
    dataset = uploaded(alpha, "rows.jsonl", ROWS)
    job_id = submitted(alpha, job_spec(dataset={"source": f"file:{dataset['id']}"}))
    hold_in(status, alpha, worker, job_id)
    refused = alpha.delete(f"/v1/files/{dataset['id']}")
    assert refused.status_code == 409, refused.text
    assert f"job {job_id} (dataset.source)" in refused.json()["error"]["message"]
    assert alpha.get(f"/v1/files/{dataset['id']}/content").content == ROWS


@pytest.mark.parametrize("status", UNFINISHED)
def test_a_job_is_kept_while_a_job_continuing_from_it_is_unfinished(alpha, job_spec, worker, api_server,
                                                                    status) -> None:
    source = submitted(alpha, job_spec())
    worker.start(source)
    write_artifacts(api_server.settings, source)  # a kept checkpoint and a final model
    worker.finish(source)
    follower = submitted(alpha, job_spec(model={"source": f"job:{source}@1"}))
    hold_in(status, alpha, worker, follower)
    refused = alpha.delete(f"/v1/jobs/{source}")
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert f"job {follower} ({status}) continues from job {source}'s model" in message
    assert alpha.get(f"/v1/jobs/{source}").status_code == 200


@pytest.mark.parametrize("written", ["job:{id}", "job: {id}", "job:0{id}", "job:{id}@1 ", "job:00{id}@01"])
def test_a_job_is_kept_however_the_source_naming_it_is_written(alpha, job_spec, worker, api_server,
                                                               written) -> None:
    source = submitted(alpha, job_spec())
    worker.start(source)
    write_artifacts(api_server.settings, source)
    worker.finish(source)
    follower = submitted(alpha, job_spec(model={"source": written.format(id=source)}))
    refused = alpha.delete(f"/v1/jobs/{source}")
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert f"job {follower} (queued) continues from job {source}'s model" in message
    assert alpha.get(f"/v1/jobs/{source}").status_code == 200


def test_a_job_is_kept_while_a_job_scoring_with_its_model_is_unfinished(alpha, job_spec, worker,
                                                                         api_server) -> None:
    from test_clone_and_job_sources import judged_by

    source = submitted(alpha, job_spec())
    worker.start(source)
    write_artifacts(api_server.settings, source)
    worker.finish(source)
    scorer = submitted(alpha, job_spec(rewards=judged_by(f"job:{source}@1")))
    refused = alpha.delete(f"/v1/jobs/{source}")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["message"] == (
        f"job {scorer} (queued) scores with job {source}'s model (rewards.0.args.graders.judge.model "
        f"job:{source}); cancel it or let it finish first")
    assert alpha.post(f"/v1/jobs/{scorer}/cancel").status_code == 200
    assert alpha.delete(f"/v1/jobs/{source}").status_code == 204
