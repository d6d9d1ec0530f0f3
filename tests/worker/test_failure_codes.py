"""Each failure the job itself causes ends it ``failed`` with its own code, never a bare
``internal_error``: the job process's body (``run_attempt``, in this process so causes can be
injected where they really arise) and the supervisor's recording of its outcome (``record_outcome``)
against the module's real Postgres. Out of memory in the forward pass, a model folder or data file gone, a hub
that cannot be reached, a reward that raises, a team over its artifact byte quota. (A full disk:
``test_disk_full.py``.)"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from api.store.db import session_scope
from api.store.teams import DEFAULT_TEAM, set_artifact_quota


def failed_with(job) -> str:
    assert job.status == "failed", (job.status, job.error)
    return job.error.code


def test_out_of_memory_in_the_forward_pass_fails_out_of_memory_saying_what_to_lower(
        submit, tiny_spec, run_in_process, monkeypatch):
    import grpo_core.algorithm.update

    def forward_out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(grpo_core.algorithm.update, "rollout_logprobs", forward_out_of_memory)
    job = run_in_process(submit(tiny_spec(max_steps=2)))
    assert failed_with(job) == "out_of_memory"
    assert "Tried to allocate 20.00 GiB" in job.error.message
    assert "grpo.max_completion_length" in job.error.message  # says what to lower


def test_a_model_folder_gone_since_submit_fails_source_unavailable(submit, tiny_spec, run_in_process, roots):
    name = f"gone-{uuid.uuid4().hex[:8]}"
    shutil.copytree(roots["models"] / "tiny", roots["models"] / name)
    job_id = submit(tiny_spec(model={"source": f"path:{name}"}))  # there at submit
    shutil.rmtree(roots["models"] / name)
    job = run_in_process(job_id)
    assert failed_with(job) == "source_unavailable"
    assert name in job.error.message and "does not exist" in job.error.message


def test_a_data_file_gone_since_submit_fails_source_unavailable(submit, tiny_spec, run_in_process, roots):
    name = f"gone-{uuid.uuid4().hex[:8]}.jsonl"
    (roots["data"] / name).write_text('{"prompt": "Is it yes?"}\n')
    job_id = submit(tiny_spec(dataset={"source": f"path:{name}"}))
    (roots["data"] / name).unlink()
    job = run_in_process(job_id)
    assert failed_with(job) == "source_unavailable"
    assert job.error.message == f"dataset.source: no such file: '{name}'"


def test_a_hub_model_that_cannot_be_reached_fails_source_unavailable(submit, tiny_spec, run_in_process,
                                                                     monkeypatch, tmp_path):
    # Offline, with an empty cache: what a worker without network sees for a model it never loaded.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    job = run_in_process(submit(tiny_spec(model={"source": "hf:grpo-tests/never-cached-model"})))
    assert failed_with(job) == "source_unavailable"
    assert "grpo-tests/never-cached-model" in job.error.message and "cannot be reached" in job.error.message


def test_a_reward_that_raises_fails_reward_error(submit, tiny_spec, run_in_process, monkeypatch):
    from grpo_core.rewards import registry

    def explodes(completions, prompts, **columns):
        raise ZeroDivisionError("the reward divided by zero")

    state = registry._registry()
    definitions = {**state.definitions, "explodes": registry._wrap_function("explodes", explodes)}
    monkeypatch.setattr(registry, "_state", dataclasses.replace(state, definitions=definitions))
    job = run_in_process(submit(tiny_spec(rewards=[{"name": "explodes"}])))
    assert failed_with(job) == "reward_error"
    assert "'explodes' raised ZeroDivisionError: the reward divided by zero" in job.error.message


@pytest.fixture
def artifact_quota(database_url):
    """``quota(bytes or None)`` on the default team (the one ``submit`` uses), cleared afterwards."""
    def set_quota(count: int | None) -> None:
        with session_scope(database_url) as session:
            set_artifact_quota(session, DEFAULT_TEAM, count)

    yield set_quota
    set_quota(None)


def test_a_checkpoint_over_the_teams_artifact_quota_fails_before_writing_anything(
        submit, tiny_spec, run_in_process, artifact_quota, task_settings):
    from api.artifacts.paths import checkpoint_dir
    from api.artifacts.usage import job_artifact_bytes

    artifact_quota(1000)  # far below the tiny model's checkpoint
    job = run_in_process(submit(tiny_spec(max_steps=2, checkpoint_every=1)))
    assert failed_with(job) == "artifact_quota_exceeded"
    assert "step 1" in job.error.message and "quota of 1000 bytes" in job.error.message
    folder = checkpoint_dir(task_settings, job.id)
    assert not folder.exists() or list(folder.iterdir()) == []  # not a byte written, no temp folder

    # Raised enough, another job of the team runs; what it wrote counts against the quota.
    artifact_quota(10**12)
    done = run_in_process(submit(tiny_spec(max_steps=2, checkpoint_every=1)))
    assert done.status == "succeeded"
    written = job_artifact_bytes(task_settings, [done.id])
    assert written > 1000 and Path(done.latest_checkpoint).is_dir()


def test_the_quota_check_lets_a_checkpoint_through_while_the_database_is_away(task_settings):
    from worker.artifacts import ArtifactQuota

    away = task_settings.model_copy(update={"database_url": "postgresql+psycopg://postgres@127.0.0.1:9/none"})
    # A blip must not fail the job: this checkpoint goes unchecked, the next one is checked again.
    ArtifactQuota(away, job_id=1, team_id=1).before_checkpoint(1, 10**15)


def test_the_quota_check_counts_the_remote_store_and_the_teams_files(
        submit, tiny_spec, artifact_quota, task_settings, database_url, team_id, s3_server, monkeypatch):
    """With GRPO_STORAGE_URL a bucket, a job's artifacts count as the bucket holds them (the
    worker's own folder is only its work copy, empty here), and the team's uploads count too."""
    from api.storage import open_store
    from api.store import files
    from grpo_core.errors import GRPOError
    from worker.artifacts import ArtifactQuota

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    settings = task_settings.model_copy(update={"storage_url": s3_server.url(f"q-{uuid.uuid4().hex[:8]}")})
    job_id = submit(tiny_spec())
    open_store(settings.storage_url, env=s3_server.env).put_stream(f"jobs/{job_id}/model/model.safetensors",
                                                                   [b"w" * 3000])
    file_id = files.new_file_id()
    with session_scope(database_url) as session:
        files.add_file(session, file_id, team_id, "dataset", "rows.jsonl", "jsonl", 2000, "0" * 64)
    try:
        artifact_quota(5000 + 999)
        quota = ArtifactQuota(settings, job_id=job_id, team_id=team_id)
        quota.before_checkpoint(1, 999)  # just fits
        with pytest.raises(GRPOError) as over:
            quota.before_checkpoint(1, 1000)
        assert over.value.code == "artifact_quota_exceeded"
        assert "(3000 bytes of job artifacts and 2000 bytes of uploaded files in use" in str(over.value)
    finally:
        with session_scope(database_url) as session:  # the module's other quota tests count no file
            files.delete_file(session, file_id, team_id)


def test_a_run_by_epochs_over_a_file_is_counted_by_the_worker_and_held_to_its_pools_step_limit(
        submit, tiny_spec, run_in_process, job_of, roots, database_url, pool):
    """Submit cannot count a file's prompts: the worker does, stores the count, and fails a job
    whose count is over its pool's limit (before a step, storing nothing, so a retry is checked again)."""
    from api.schemas.admin import PoolLimits
    from api.store.pools import create_pool, set_limits

    name = f"four-{uuid.uuid4().hex[:8]}.jsonl"
    (roots["data"] / name).write_text("".join(f'{{"prompt": "Is {n} yes?"}}\n' for n in range(4)))
    # 4 prompts, 2 a step, one epoch: 2 steps
    spec = tiny_spec(pool=pool, max_steps=-1, grpo={"num_train_epochs": 1},
                     dataset={"source": f"path:{name}"})
    with session_scope(database_url) as session:
        create_pool(session, pool)
        set_limits(session, pool, PoolLimits(max_steps=1))
    over = submit(spec)
    assert job_of(over).max_steps is None  # not known at submit
    job = run_in_process(over)
    assert failed_with(job) == "invalid_spec"
    assert job.error.message == (f"grpo.max_steps: 2 steps (grpo.num_train_epochs = 1); pool '{pool}' "
                                 "allows at most 1")
    assert (job.max_steps, job.last_step) == (None, 0)

    with session_scope(database_url) as session:
        set_limits(session, pool, PoolLimits())
    done = run_in_process(submit(spec))
    assert done.status == "succeeded", done.error
    assert done.max_steps == done.last_step == 2


def test_an_eval_set_from_a_file_is_counted_by_the_worker_and_held_to_its_pools_token_bound(
        submit, tiny_spec, run_in_process, job_of, roots, database_url, pool):
    """Submit counts inline eval rows only; the worker counts a file's once the data loads (the
    trainer's ``started`` event carries them) and fails a job whose eval point is over the pool's
    per-step token bound, before its step-0 eval and its first step."""
    from api.schemas.admin import PoolLimits
    from api.store.pools import create_pool, set_limits

    name = f"eval-{uuid.uuid4().hex[:8]}.jsonl"
    (roots["data"] / name).write_text("".join(f'{{"prompt": "Is {n} yes?"}}\n' for n in range(5)))
    evaluation = {"eval_strategy": "steps", "eval_steps": 1, "eval_on_start": True, "eval_num_generations": 2}
    spec = tiny_spec(pool=pool, max_steps=1, grpo=evaluation, eval_dataset={"source": f"path:{name}"})
    # A step: 2 prompts × 2 completions × (256 + 8) = 1,056 tokens; an eval point 5 × 2 × 264 = 2,640.
    with session_scope(database_url) as session:
        create_pool(session, pool)
        set_limits(session, pool, PoolLimits(max_tokens_per_step=2_500))
    job = run_in_process(submit(spec))  # submit took it: it could not count the file
    assert failed_with(job) == "invalid_spec"
    assert job.error.message == (
        "eval_dataset.source: 5 eval prompts × grpo.eval_num_generations 2 × (max_prompt_length + "
        f"max_completion_length) 264 = 2,640 tokens per eval point; pool '{pool}' allows at most 2,500 "
        "per step: use fewer eval prompts or lower one of them")
    assert job.last_step == 0

    with session_scope(database_url) as session:
        set_limits(session, pool, PoolLimits(max_tokens_per_step=2_640))  # exactly one eval point
    done = run_in_process(submit(spec))
    assert done.status == "succeeded", done.error


def test_deleting_a_finished_job_frees_the_teams_artifact_quota(
        submit, tiny_spec, run_in_process, artifact_quota, task_settings, settings, database_url, team_id):
    """A real job's checkpoints and final model fill the quota so that the next job fails; the team
    deletes the first over the real API (in-process, auth off: the default team) and the second,
    retried, fits in what that freed (one step: the first held a checkpoint and a final model,
    more than the second's one checkpoint is estimated at)."""
    from fastapi.testclient import TestClient

    from api.artifacts.paths import job_dir
    from api.artifacts.usage import job_artifact_bytes
    from api.main import create_app
    from api.store.teams import artifact_quota as quota_and_jobs

    artifact_quota(None)
    first = run_in_process(submit(tiny_spec(max_steps=1, checkpoint_every=1)))
    assert first.status == "succeeded", first.error
    own = job_artifact_bytes(task_settings, [first.id])
    with session_scope(database_url) as session:
        used = job_artifact_bytes(task_settings, quota_and_jobs(session, team_id, always=True)[1])
    artifact_quota(used)  # full: the next checkpoint of any job of the team is over it
    second = run_in_process(submit(tiny_spec(max_steps=1, checkpoint_every=1)))
    assert failed_with(second) == "artifact_quota_exceeded"

    with TestClient(create_app(settings.model_copy(update={"auth": "none"}))) as api:
        assert api.get("/v1/me").json()["artifact_bytes"] == used
        assert api.delete(f"/v1/jobs/{first.id}").status_code == 204
        assert not job_dir(task_settings, first.id).exists()
        me = api.get("/v1/me").json()
        assert (me["artifact_bytes"], me["artifact_quota_bytes"]) == (used - own, used)
        assert api.post(f"/v1/jobs/{second.id}/retry").status_code == 200
    again = run_in_process(second.id)
    assert again.status == "succeeded", again.error
