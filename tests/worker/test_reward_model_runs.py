"""A job with the issue-15 rewards in a real worker process: a reward_model from the service's
models root (loaded by the job's process on its device), text_similarity against a column, a
gate and a clip; the job succeeds and logs each component as rewards/{name}/mean|std."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_run_job import dispatch_by_hand

from api.domain.job_spec import JobSpec
from api.http.submission import check_submission
from api.scheduling.scheduler import celery_client
from api.store.db import session_scope
from api.store.telemetry import list_metrics

pytestmark = pytest.mark.slow
ROWS = [{"prompt": "Is it yes?", "answer": "yes"}, {"prompt": "What is 2+3?", "answer": "5"}]
REWARDS = [
    {"name": "reward_model", "args": {"model": "path:tiny-rm", "batch_size": 3}, "clip_min": -0.05,
     "clip_max": 0.05},
    {"name": "text_similarity", "args": {"metric": "fuzzy_ratio"}, "gate_by": "reward_model",
     "gate_threshold": -1000.0},
]


@pytest.fixture(scope="module")
def reward_model_in_root(roots: dict[str, Path]) -> Path:
    from grpo_core.io.tiny_models import build_tiny_model

    return build_tiny_model(roots["models"] / "tiny-rm", family="qwen2", num_labels=1)


def test_a_job_trains_with_a_reward_model_and_shaped_rewards(
    reward_model_in_root, processes, submit, tiny_spec, finished, wait_for, pool, settings, database_url,
    wait_worker_ready,
):
    spec = tiny_spec(pool=pool, max_steps=2, rewards=REWARDS, dataset={"prompts": ROWS})
    check_submission(JobSpec.model_validate(spec), settings)  # what POST /v1/jobs checks first
    job_id = submit(spec)
    processes.worker(pool)
    [worker_id] = wait_worker_ready(pool, processes)
    dispatch_by_hand(settings, celery_client(settings), job_id, worker_id, copies=1)
    job = wait_for(lambda: finished(job_id), 180, "the job to end", processes)
    assert job.status == "succeeded", job.error

    with session_scope(database_url) as session:
        metrics = list_metrics(session, job_id)
    assert [m.step for m in metrics] == [1, 2]
    for values in (m.values for m in metrics):
        assert -0.05 <= values["rewards/reward_model/mean"] <= 0.05  # clipped
        assert 0.0 <= values["rewards/text_similarity/mean"] <= 1.0
        assert {"rewards/reward_model/std", "rewards/text_similarity/std"} <= set(values)
