"""A TRL config pasted into a spec, over real HTTP: a TRL field we do not take is a 422 naming
``grpo.<field>`` and what to use instead; a run by epochs (``max_steps: -1``, TRL's default) shows
its step count as soon as it is known: at submit for inline rows, from the worker for a file."""

from __future__ import annotations


def test_refused_trl_fields_are_a_422_naming_each_and_its_replacement(api, job_spec) -> None:
    spec = job_spec(grpo={"per_device_train_batch_size": 16, "use_vllm": True, "bf16": True})
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    errors = {e["param"]: e["message"] for e in response.json()["error"]["errors"]}
    assert set(errors) == {"grpo.per_device_train_batch_size", "grpo.use_vllm", "grpo.bf16"}
    assert "grpo.prompts_per_step" in errors["grpo.per_device_train_batch_size"]
    assert "not vLLM" in errors["grpo.use_vllm"] and "model.dtype" in errors["grpo.bf16"]


def test_accepted_trl_fields_are_stored_with_the_spec(api, job_spec) -> None:
    trl = {"lr_scheduler_type": "cosine", "warmup_steps": 0.1, "repetition_penalty": 1.1, "min_p": 0.05,
           "save_total_limit": 2}
    job = api.post("/v1/jobs", json=job_spec(grpo=trl)).json()
    assert {k: job["spec"]["grpo"][k] for k in trl} == trl
    assert job["spec"]["checkpoint_keep_last"] == 2


def test_a_run_by_epochs_shows_its_step_count_once_known(api, job_spec) -> None:
    inline = api.post("/v1/jobs", json=job_spec(max_steps=-1, grpo={"num_train_epochs": 2})).json()
    # tests/specs.py's 4 inline prompts, 2 a step: 2 steps an epoch
    assert (inline["max_steps"], inline["spec"]["grpo"]["max_steps"]) == (4, -1)
    from_file = api.post("/v1/jobs", json=job_spec(max_steps=-1, dataset={"source": "path:prompts.jsonl"}))
    assert from_file.status_code == 201, from_file.text
    assert from_file.json()["max_steps"] is None  # the worker counts the file's prompts
    listed = api.get("/v1/jobs", params={"order": "desc", "limit": 2}).json()["items"]
    assert [job["max_steps"] for job in listed] == [None, 4]
