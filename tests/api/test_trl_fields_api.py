"""A TRL config pasted into a spec, over real HTTP: a TRL field we do not take is a 422 naming
``grpo.<field>`` and what to use instead, unless its value asks for nothing (TRL's default
``push_to_hub: false``): then it is taken and the submit's answer and the job's events warn that it
is ignored; a misspelt field is a 422 naming the field it probably meant; a run by epochs
(``max_steps: -1``, TRL's default) shows its step count as soon as it is known: at submit for
inline rows, from the worker for a file."""

from __future__ import annotations


def test_refused_trl_fields_are_a_422_naming_each_and_its_replacement(api, job_spec) -> None:
    spec = job_spec(grpo={"per_device_train_batch_size": 16, "use_vllm": True, "bf16": True})
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    errors = {e["param"]: e["message"] for e in response.json()["error"]["errors"]}
    assert set(errors) == {"grpo.per_device_train_batch_size", "grpo.use_vllm", "grpo.bf16"}
    assert "grpo.prompts_per_step = per_device_train_batch_size × resources.gpus × " \
        "gradient_accumulation_steps / num_generations" in errors["grpo.per_device_train_batch_size"]
    assert "not vLLM" in errors["grpo.use_vllm"] and "model.dtype" in errors["grpo.bf16"]


def test_accepted_trl_fields_are_stored_with_the_spec(api, job_spec) -> None:
    trl = {"lr_scheduler_type": "cosine", "warmup_steps": 0.1, "repetition_penalty": 1.1, "min_p": 0.05,
           "save_total_limit": 2}
    job = api.post("/v1/jobs", json=job_spec(grpo=trl)).json()
    assert {k: job["spec"]["grpo"][k] for k in trl} == trl
    assert job["spec"]["checkpoint_keep_last"] == 2


def test_trls_eval_fields_are_taken_with_an_eval_dataset(api, job_spec) -> None:
    trl = {"eval_strategy": "steps", "eval_steps": 0.5, "eval_on_start": True}
    eval_dataset = {"prompts": [{"prompt": "Say yes."}]}
    job = api.post("/v1/jobs", json=job_spec(grpo=trl, eval_dataset=eval_dataset)).json()
    assert {k: job["spec"]["grpo"][k] for k in trl} == trl
    assert job["spec"]["eval_dataset"]["prompts"] == eval_dataset["prompts"]
    missing = api.post("/v1/jobs", json=job_spec(grpo=trl))
    assert missing.status_code == 422, missing.text
    assert missing.json()["error"]["param"] == "eval_dataset"


def test_a_run_by_epochs_shows_its_step_count_once_known(api, job_spec) -> None:
    inline = api.post("/v1/jobs", json=job_spec(max_steps=-1, grpo={"num_train_epochs": 2})).json()
    # tests/specs.py's 4 inline prompts, 2 a step: 2 steps an epoch
    assert (inline["max_steps"], inline["spec"]["grpo"]["max_steps"]) == (4, -1)
    from_file = api.post("/v1/jobs", json=job_spec(max_steps=-1, dataset={"source": "path:prompts.jsonl"}))
    assert from_file.status_code == 201, from_file.text
    assert from_file.json()["max_steps"] is None  # the worker counts the file's prompts
    listed = api.get("/v1/jobs", params={"order": "desc", "limit": 2}).json()["items"]
    assert [job["max_steps"] for job in listed] == [None, 4]


def test_trl_fields_that_ask_for_nothing_are_taken_with_a_warning_in_the_answer_and_the_events(
        api, job_spec) -> None:
    off = {"push_to_hub": False, "use_vllm": False, "log_completions": False}
    response = api.post("/v1/jobs", json=job_spec(grpo={**off, "scale_rewards": False}))
    assert response.status_code == 201, response.text
    job = response.json()
    fields = [f"grpo.{name}" for name in off]
    assert [warning["param"] for warning in job["warnings"]] == fields
    assert all("ignored" in warning["message"] for warning in job["warnings"])
    assert not set(off) & set(job["spec"]["grpo"]) and job["spec"]["grpo"]["scale_rewards"] == "none"
    events = api.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    ignored = [event for event in events if event["type"] == "spec_field_ignored"]
    assert [(event["level"], event["data"]["field"]) for event in ignored] == [("warning", f) for f in fields]
    assert all(event["message"].startswith(f"{f}: ignored") for event, f in zip(ignored, fields, strict=True))
    assert api.get(f"/v1/jobs/{job['id']}").json()["warnings"] == []  # told once, at submit


def test_a_yaml_body_with_an_ignored_field_gets_the_same_warning(api, job_spec) -> None:
    import json

    body = json.dumps(job_spec(grpo={"push_to_hub": False}))  # JSON is YAML
    response = api.post("/v1/jobs", content=body, headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201, response.text
    assert [warning["param"] for warning in response.json()["warnings"]] == ["grpo.push_to_hub"]


def test_a_misspelt_field_is_a_422_naming_the_field_it_probably_meant(api, job_spec) -> None:
    spec = job_spec(grpo={"num_generation": 4})
    spec["learning_rate"] = 1e-5
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    errors = {e["param"]: e["message"] for e in response.json()["error"]["errors"]}
    assert errors == {"grpo.num_generation": "unknown field; did you mean 'num_generations'?",
                      "learning_rate": "belongs under grpo: write it as grpo.learning_rate"}
