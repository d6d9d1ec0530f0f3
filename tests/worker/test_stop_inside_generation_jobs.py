"""A job cancelled or paused while it generates a long batch stops inside that generation,
through a real Celery worker, Postgres and Redis: it ends ``cancelled`` (``paused``) by itself
(not killed after the grace period), with no step trained or recorded, and its ``stopped`` event
says how far the generation got. Before, the stop was read only between steps, so a cancel
waited for the whole step (43 s in the report that asked for this) or for the supervisor's kill."""

from __future__ import annotations

import pytest
from test_run_job import dispatch_by_hand, events

from api.domain.lifecycle import TERMINAL_STATUSES
from api.scheduling.scheduler import celery_client
from api.store.db import session_scope
from api.store.jobs import request_cancel, request_pause
from api.store.telemetry import list_metrics
from grpo_core.io.tiny_models import build_tiny_model

pytestmark = pytest.mark.slow

COMPLETION = 992  # with 32 prompt tokens, all of the model's 1,024 positions


@pytest.mark.parametrize(("ask", "asked", "ended"), [(request_cancel, "cancelling", "cancelled"),
                                                    (request_pause, "pausing", "paused")])
def test_a_stop_inside_a_long_generation_stops_it_there(processes, submit, tiny_spec, wait_for, pool,
                                                        settings, database_url, roots, wait_worker_ready, ask,
                                                        asked, ended, job_of):
    # Deeper than the tiny model, so its 992-token generation lasts many seconds on a busy CPU
    # (~20 ms a token) and the stop lands inside it: the random model rarely says EOS.
    deep = roots["models"] / "deep-tiny"
    if not deep.exists():
        build_tiny_model(deep, num_layers=24)
    sizes = {"max_prompt_length": 32, "max_completion_length": COMPLETION, "num_generations": 4}
    spec = tiny_spec(pool=pool, max_steps=2, model={"source": "path:deep-tiny"}, grpo=sizes)
    job_id = submit(spec)
    processes.worker(pool)
    [worker_id] = wait_worker_ready(pool, processes)
    dispatch_by_hand(settings, celery_client(settings), job_id, worker_id, copies=1)
    # "started" is reported just before the run asks whether to stop and starts generating.
    wait_for(lambda: events(database_url, job_id, "started"), 120, "training to start", processes)
    with session_scope(database_url) as session:
        assert ask(session, job_id).status == asked

    def at_rest():
        job = job_of(job_id)
        return job if job.status == ended or job.status in TERMINAL_STATUSES else None

    job = wait_for(at_rest, 120, f"the job to be {ended}", processes)
    assert job.status == ended, (job.status, job.error)
    with session_scope(database_url) as session:
        assert list_metrics(session, job_id) == []
    [stopped] = events(database_url, job_id, "stopped")  # the run's own: it stopped, was not killed
    assert stopped.data["step"] == 0
    assert 0 < stopped.data["generation_tokens"] < COMPLETION, stopped.data
    assert "not trained" in stopped.message
