"""OpenAI's fine-tuning API (``/v1/fine_tuning/jobs``, ``POST /v1/files`` with ``purpose=fine-tune``)
driven by the real ``openai`` client against the module's server: a JSONL uploaded as OpenAI's
file object, a reinforcement job created with a grader and seen both ways (``ftjob-N`` here, job N
at ``/v1/jobs`` with the spec it maps to), listed in pages and by metadata, cancelled, paused and
resumed by ``/v1/jobs``' rules, its events and checkpoints in OpenAI's shapes (a job driven by the
scripted worker), and each refusal with its status and ``param``. The mapping's own cases are
``test_openai_mapping.py``'s."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx2
import openai
import pytest
from openai import ConflictError, NotFoundError, UnprocessableEntityError

ROWS = [{"messages": [{"role": "system", "content": "Answer with one word."},
                      {"role": "user", "content": question}], "reference_answer": answer}
        for question, answer in (("Capital of France?", "Paris"), ("Capital of Italy?", "Rome"),
                                 ("Capital of Spain?", "Madrid"), ("Capital of Peru?", "Lima"))]
JSONL = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.reference_answer}}", "operation": "eq"}
HYPERPARAMETERS = "method.reinforcement.hyperparameters"


@pytest.fixture
def openai_for(api_server) -> Iterator[Callable[[str], openai.OpenAI]]:
    """``openai_for(key)``: the official client, its base URL the server's ``/v1``."""
    made: list[openai.OpenAI] = []

    def factory(key: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{api_server.http_url}/v1", api_key=key, max_retries=0,
                               http_client=httpx2.Client(trust_env=False, timeout=10))
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def client(openai_for, team_keys) -> openai.OpenAI:
    return openai_for(team_keys.alpha)


@pytest.fixture
def training_file(client) -> str:
    return client.files.create(file=("rft.jsonl", JSONL), purpose="fine-tune").id


def reinforcement(grader: dict | None = None, **hyperparameters) -> dict:
    return {"type": "reinforcement",
            "reinforcement": {"grader": grader or GRADER, "hyperparameters": hyperparameters}}


def create(client: openai.OpenAI, training_file: str, **fields):
    body = {"model": "path:tiny", "training_file": training_file, "method": reinforcement(), **fields}
    return client.fine_tuning.jobs.create(**body)


def our_id(ftjob: str) -> int:
    assert ftjob.startswith("ftjob-")
    return int(ftjob.removeprefix("ftjob-"))


def test_an_upload_with_purpose_fine_tune_answers_openais_file_object(client, alpha) -> None:
    uploaded = client.files.create(file=("rft.jsonl", JSONL), purpose="fine-tune")
    assert (uploaded.object, uploaded.purpose, uploaded.status, uploaded.filename, uploaded.bytes) == (
        "file", "fine-tune", "processed", "rft.jsonl", len(JSONL))
    assert isinstance(uploaded.created_at, int) and uploaded.id.startswith("file-")
    extra = uploaded.model_dump()
    assert (extra["prompt_field"], extra["rows"], extra["columns"]) == ("messages", 4,
                                                                       ["messages", "reference_answer"])
    assert client.files.retrieve(uploaded.id).model_dump() == extra
    assert alpha.get(f"/v1/files/{uploaded.id}").json() == extra  # the same answer to any client
    # To our own list it is a dataset like any other (its purpose there is ours).
    listed = next(item for item in alpha.get("/v1/files").json()["items"] if item["id"] == uploaded.id)
    assert (listed["purpose"], listed["prompt_field"]) == ("dataset", "messages")
    assert b"Paris" in client.files.content(uploaded.id).content
    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.deleted) == (uploaded.id, True)
    # Our own purposes answer as they always did.
    ours = alpha.post("/v1/files", data={"purpose": "dataset"},
                      files={"file": ("p.jsonl", b'{"prompt": "hi"}\n')}).json()
    assert ours["purpose"] == "dataset" and "object" not in ours
    assert alpha.get(f"/v1/files/{ours['id']}").json() == ours
    assert alpha.delete(f"/v1/files/{ours['id']}").json() == ours


def test_a_reinforcement_job_is_one_of_our_jobs(client, alpha, training_file) -> None:
    method = reinforcement(n_epochs=2, batch_size=2, learning_rate_multiplier=3, compute_multiplier=0.5,
                           eval_interval=5, eval_samples=2)
    job = create(client, training_file, validation_file=training_file, method=method, suffix="capitals",
                 seed=7, metadata={"project": "geo"})
    assert job.object == "fine_tuning.job" and job.status == "queued"
    assert (job.model, job.training_file, job.validation_file, job.seed) == (
        "path:tiny", training_file, training_file, 7)
    assert (job.organization_id, job.fine_tuned_model, job.finished_at, job.result_files) == (
        "alpha", None, None, [])
    assert (job.trained_tokens, job.error, job.estimated_finish, job.integrations) == (None, None, None, None)
    assert job.metadata == {"project": "geo"}
    shown = job.model_dump()
    assert (shown["suffix"], shown["user_provided_suffix"]) == ("capitals", "capitals")
    assert job.method.model_dump(exclude_unset=True) == method  # as sent
    assert shown["hyperparameters"] == {"n_epochs": 2, "batch_size": 2, "learning_rate_multiplier": 3.0,
                                        "eval_interval": 5, "eval_samples": 2, "compute_multiplier": 0.5}
    assert client.fine_tuning.jobs.retrieve(job.id).model_dump() == shown

    ours = alpha.get(f"/v1/jobs/{our_id(job.id)}").json()
    spec = ours["spec"]
    assert (ours["name"], ours["status"]) == ("capitals", "queued")
    assert spec["model"]["source"] == "path:tiny"
    dataset = spec["dataset"]
    assert (dataset["source"], dataset["prompt_field"]) == (f"file:{training_file}", "messages")
    assert spec["eval_dataset"]["source"] == f"file:{training_file}"
    assert spec["rewards"] == [{"name": "string_check", "weight": 1.0, "clip_min": None, "clip_max": None,
                                "gate_by": None, "gate_threshold": None,
                                "args": {key: GRADER[key] for key in ("input", "reference", "operation")}}]
    grpo = spec["grpo"]
    assert (grpo["num_train_epochs"], grpo["prompts_per_step"], grpo["num_generations"], grpo["seed"]) == (
        2, 2, 4, 7)
    assert grpo["learning_rate"] == pytest.approx(3e-6)
    assert (grpo["eval_strategy"], grpo["eval_steps"], grpo["eval_num_generations"]) == ("steps", 5, 2)


def test_a_job_submitted_our_way_is_seen_openais_way(client, alpha, job_spec) -> None:
    submitted = alpha.post("/v1/jobs", json=job_spec(name="native")).json()
    job = client.fine_tuning.jobs.retrieve(f"ftjob-{submitted['id']}")
    assert (job.status, job.model, job.training_file, job.validation_file, job.seed) == (
        "queued", "path:tiny", "inline", None, 0)
    shown = job.model_dump()
    assert (shown["suffix"], shown["user_provided_suffix"], shown["metadata"]) == ("native", None, None)
    assert shown["hyperparameters"]["n_epochs"] is None  # it trains for max_steps: 20
    assert shown["method"]["type"] == "reinforcement" and shown["method"]["reinforcement"]["grader"] is None
    assert shown["hyperparameters"]["learning_rate_multiplier"] == 1000.0  # 1e-3 over the 1e-6 base


def test_jobs_list_newest_first_in_pages_and_by_metadata(client, beta, job_spec, training_file) -> None:
    made = [create(client, training_file, suffix=f"page-{index}",
                   metadata={"batch": "b1", 'odd "key".$': str(index)}) for index in range(3)]
    beta.post("/v1/jobs", json=job_spec(name="beta-only"))  # another team's: never listed
    first = client.fine_tuning.jobs.list(limit=2)
    assert [job.id for job in first.data] == [made[2].id, made[1].id] and first.has_more
    walked = [job.id for job in client.fine_tuning.jobs.list(limit=2)]
    assert walked[:3] == [job.id for job in reversed(made)]
    assert all(job.organization_id == "alpha" for job in client.fine_tuning.jobs.list(limit=100).data)
    by_metadata = client.fine_tuning.jobs.list(metadata={"batch": "b1", 'odd "key".$': "1"})
    assert [job.id for job in by_metadata.data] == [made[1].id] and not by_metadata.has_more


def test_cancel_pause_and_resume_follow_our_rules(client, alpha, training_file, worker) -> None:
    waiting = create(client, training_file)
    assert client.fine_tuning.jobs.pause(waiting.id).status == "paused"
    assert alpha.get(f"/v1/jobs/{our_id(waiting.id)}").json()["status"] == "paused"
    assert client.fine_tuning.jobs.resume(waiting.id).status == "queued"
    cancelled = client.fine_tuning.jobs.cancel(waiting.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    with pytest.raises(ConflictError):  # a finished job cannot be paused, here as at /v1/jobs
        client.fine_tuning.jobs.pause(waiting.id)

    running = create(client, training_file)
    worker.start(our_id(running.id))
    assert client.fine_tuning.jobs.retrieve(running.id).status == "running"
    pausing = client.fine_tuning.jobs.pause(running.id)  # ours: pausing, until its next step
    assert (pausing.status, pausing.finished_at) == ("paused", None)
    assert alpha.get(f"/v1/jobs/{our_id(running.id)}").json()["status"] == "pausing"
    with pytest.raises(ConflictError):  # not paused yet
        client.fine_tuning.jobs.resume(running.id)
    stopping = client.fine_tuning.jobs.cancel(running.id)  # ours: cancelling
    assert (stopping.status, stopping.finished_at) == ("cancelled", None)
    assert alpha.get(f"/v1/jobs/{our_id(running.id)}").json()["status"] == "cancelling"


def test_events_and_checkpoints_of_a_trained_job(client, training_file, worker, api_server) -> None:
    from api.store.db import session_scope
    from api.store.telemetry import record_checkpoint

    job = create(client, training_file)
    job_id = our_id(job.id)
    worker.start(job_id)
    for step in (1, 2, 3):
        worker.reporter(job_id).on_step({"step": step, "reward": 0.25 * step, "loss": 0.5 / step,
                                         "num_tokens": 100 * step})
    with session_scope(api_server.settings.database_url) as session:
        for step in (2, 3):
            record_checkpoint(session, job_id, step, f"/ckpt/{job_id}/step-{step}", 1)
    worker.event(job_id, "checkpoint", "checkpoint saved", {"step": 3, "path": f"/ckpt/{job_id}/step-3"})
    assert client.fine_tuning.jobs.retrieve(job.id).trained_tokens == 300
    worker.finish(job_id)
    done = client.fine_tuning.jobs.retrieve(job.id)
    assert (done.status, done.fine_tuned_model, done.trained_tokens) == ("succeeded", f"job:{job_id}", 300)
    assert isinstance(done.finished_at, int) and done.finished_at >= done.created_at

    events = client.fine_tuning.jobs.list_events(job.id, limit=2)
    assert len(events.data) == 2 and events.has_more
    every = list(client.fine_tuning.jobs.list_events(job.id, limit=2))
    ids = [int(event.id.removeprefix("ftevent-")) for event in every]
    assert ids == sorted(ids, reverse=True)  # newest first
    assert every[0].data["event"] == "succeeded" and every[-1].data["event"] == "queued"
    [saved] = [event for event in every if event.data["event"] == "checkpoint"]
    assert (saved.message, saved.data["path"]) == ("checkpoint saved", "step-3")  # its name, not the path
    assert {event.object for event in every} == {"fine_tuning.job.event"}
    assert {event.level for event in every} <= {"info", "warn", "error"}

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id, limit=1)
    [newest] = checkpoints.data
    assert checkpoints.has_more
    assert (newest.id, newest.step_number, newest.fine_tuned_model_checkpoint, newest.fine_tuning_job_id) == (
        f"ftckpt-{job_id}-3", 3, f"job:{job_id}@3", job.id)
    assert newest.metrics.model_dump(exclude_none=True) == {"step": 3.0, "train_loss": pytest.approx(0.5 / 3),
                                                             "train_reward_mean": 0.75}
    steps = [point.step_number for point in client.fine_tuning.jobs.checkpoints.list(job.id)]
    assert steps == [3, 2]


def test_the_idempotency_key_is_honored(client, training_file) -> None:
    key = {"Idempotency-Key": "rft-once"}
    first = create(client, training_file, metadata={"try": "1"}, extra_headers=key)
    again = create(client, training_file, metadata={"try": "1"}, extra_headers=key)
    assert again.id == first.id
    with pytest.raises(ConflictError) as refused:
        create(client, training_file, metadata={"try": "2"}, extra_headers=key)
    assert refused.value.param == "Idempotency-Key"


@pytest.mark.parametrize("fields, param", [
    ({"model": "o4-mini-2025-04-16"}, "model"),
    ({"method": {"type": "supervised", "supervised": {}}}, "method.type"),
    ({"method": reinforcement(reasoning_effort="high")}, f"{HYPERPARAMETERS}.reasoning_effort"),
    ({"method": reinforcement(n_epochs=0)}, f"{HYPERPARAMETERS}.n_epochs"),
    ({"method": reinforcement(batch_size=100_000)}, f"{HYPERPARAMETERS}.batch_size"),
    ({"method": reinforcement(eval_interval=3)}, f"{HYPERPARAMETERS}.eval_interval"),
    ({"method": reinforcement({**GRADER, "operation": "equals"})}, "method.reinforcement.grader.operation"),
    ({"method": reinforcement({**GRADER, "type": "regex"})}, "method.reinforcement.grader.type"),
    ({"method": reinforcement({**GRADER, "reference": "{{item.answer}}"})}, "method.reinforcement.grader"),
    ({"training_file": "file-abc"}, "training_file"),
    ({"training_file": "file-" + "0" * 24}, "training_file"),
    ({"suffix": "x" * 200}, "suffix"),
    ({"integrations": [{"type": "wandb", "wandb": {"project": "p"}}]}, "integrations"),
], ids=["openai-model", "supervised", "reasoning-effort", "zero-epochs", "huge-batch", "eval-without-file",
        "grader-field", "grader-type", "grader-column", "not-a-file-id", "no-such-file", "long-suffix",
        "integrations"])
def test_each_refusal_is_a_422_naming_openais_field(client, training_file, fields, param) -> None:
    with pytest.raises(UnprocessableEntityError) as refused:
        create(client, **{"training_file": training_file, **fields})
    assert refused.value.status_code == 422 and refused.value.param == param, refused.value.body


def test_a_job_of_another_team_or_an_id_of_another_form_is_a_404(openai_for, team_keys, training_file,
                                                                 client) -> None:
    job = create(client, training_file)
    other = openai_for(team_keys.beta)
    calls = [other.fine_tuning.jobs.retrieve, other.fine_tuning.jobs.cancel, other.fine_tuning.jobs.pause,
             other.fine_tuning.jobs.resume, other.fine_tuning.jobs.list_events,
             other.fine_tuning.jobs.checkpoints.list]
    for call in calls:
        with pytest.raises(NotFoundError) as missing:
            call(job.id)
        assert missing.value.param == "fine_tuning_job_id"
    assert job.id not in [listed.id for listed in other.fine_tuning.jobs.list(limit=100).data]
    for wrong in (job.id.removeprefix("ftjob-"), f"ftjob-0{our_id(job.id)}", "ftjob-x", "ft-job-1"):
        with pytest.raises(NotFoundError):
            client.fine_tuning.jobs.retrieve(wrong)
    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
    assert openai_for(team_keys.admin).fine_tuning.jobs.retrieve(job.id).organization_id == "alpha"
