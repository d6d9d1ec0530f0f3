"""Sizes checked against the model at submit, over real HTTP (Postgres and SQLite): a spec whose
longest sequence (max_prompt_length + max_completion_length) is more than the model's positions
is a 422 naming grpo.max_completion_length and queues nothing, for each source whose config.json
the service can read (``path:``, ``file:``, ``job:``); one that fits is queued. An ``hf:`` model is
checked by the core before its first step (tests/grpo_core/test_size_checks.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from test_files import model_archive, uploaded
from test_jobs_api import row_counts

from api.artifacts.paths import model_dir


def _submit(client, job_spec, source: str, completion: int, **fields):
    sizes = {"max_prompt_length": 32, "max_completion_length": completion}
    return client.post("/v1/jobs", json=job_spec(model={"source": source}, grpo=sizes, **fields))


def _assert_too_long(response, positions: int = 1024) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and error["param"] == "grpo.max_completion_length", error
    assert f"{positions} positions" in error["message"] and "at most" in error["message"], error


@pytest.mark.parametrize("key", ["max_position_embeddings", "n_positions"])
def test_a_path_model_too_short_for_the_spec_is_422(alpha, api_server, job_spec, key) -> None:
    folder = api_server.settings.models_root / f"short-{key}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "x", key: 1024}))
    before = row_counts(api_server.settings.database_url)
    _assert_too_long(_submit(alpha, job_spec, f"path:short-{key}", 993))
    assert row_counts(api_server.settings.database_url) == before
    assert _submit(alpha, job_spec, f"path:short-{key}", 992).status_code == 201


def test_an_uploaded_model_too_short_for_the_spec_is_422(alpha, job_spec, pool) -> None:
    for top in ("", "tiny-model/"):
        model = uploaded(alpha, "tiny.tar.gz", model_archive(top=top), "model")
        _assert_too_long(_submit(alpha, job_spec, f"file:{model['id']}", 4096, pool=pool))
        assert _submit(alpha, job_spec, f"file:{model['id']}", 64, pool=pool).status_code == 201


def test_a_job_model_too_short_for_the_spec_is_422(alpha, job_spec, api_server, tiny_model_dir) -> None:
    done = alpha.post("/v1/jobs", json=job_spec())
    assert done.status_code == 201, done.text
    shutil.copytree(tiny_model_dir, model_dir(api_server.settings, done.json()["id"]))
    _assert_too_long(_submit(alpha, job_spec, f"job:{done.json()['id']}", 2000))
    assert _submit(alpha, job_spec, f"job:{done.json()['id']}", 100).status_code == 201


@pytest.mark.parametrize(("batch", "param", "drawn"), [
    ({"prompts_per_step": 8}, "grpo.prompts_per_step", "8 prompts a step"),
    # TRL's way to draw 3 steps' prompts at once: 12 completions, 6 prompts, for 4 rows.
    ({"prompts_per_step": 2, "generation_batch_size": 12}, "grpo.generation_batch_size",
     "6 prompts a generation round (3 steps)"),
])
def test_a_batch_over_the_datasets_rows_is_a_warning_in_the_answer_and_the_events(alpha, job_spec, batch,
                                                                                  param, drawn) -> None:
    response = alpha.post("/v1/jobs", json=job_spec(grpo=batch))  # the spec's 4 inline prompts
    assert response.status_code == 201, response.text
    [warning] = response.json()["warnings"]
    assert warning["param"] == param, warning
    assert drawn in warning["message"] and "the dataset has 4 rows" in warning["message"], warning
    events = alpha.get(f"/v1/jobs/{response.json()['id']}/events").json()["items"]
    [event] = [e for e in events if e["type"] == "prompts_over_dataset"]
    assert event["level"] == "warning" and event["message"] == f"{param}: {warning['message']}"
    assert event["data"] == {"field": param}

    fits = alpha.post("/v1/jobs", json=job_spec(grpo={"prompts_per_step": 4}))
    assert fits.status_code == 201 and fits.json()["warnings"] == [], fits.text
