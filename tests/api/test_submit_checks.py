"""What a submit refuses before anything is queued (issue 12, Why 2 and 7), over real HTTP on
Postgres and SQLite: each bad spec is a 422 naming the field's path and leaves no row behind;
with ``GRPO_ALLOW_HUB=false`` an ``hf:`` source is refused; so is a reward budget above the
service's cap."""

from __future__ import annotations

import httpx
import pytest
from test_jobs_api import row_counts

CATASTROPHIC = {"name": "regex_match", "args": {"pattern": "(?s)(.|.)*(?!)"}}
BAD_SPECS = [
    # (what to change, the param the 422 must name)
    ({"rewards": [{"name": "regex_match", "args": {"pattern": "("}}]}, "rewards.0.args.pattern"),
    ({"rewards": [CATASTROPHIC, {"name": "regex_match", "args": {"pattern": "[z-a]"}}]},
     "rewards.1.args.pattern"),
    ({"rewards": [{"name": "regex_match", "args": {"pattern": "(?:a{65535}){65535}"}}]},
     "rewards.0.args.pattern"),  # would compile for ever in the API's process
    ({"dataset": {"prompts": [{"question": "2+2?"}]}}, "dataset.prompts.0"),
    ({"dataset": {"prompts": []}}, "dataset.prompts"),
    ({"dataset": {"prompts": [{"prompt": "x", "completions": "y"}]}}, "dataset.prompts.0.completions"),
    ({"dataset": {"prompts": [{"prompt": [{"role": "user"}]}]}}, "dataset.prompts.0.prompt"),
    ({"dataset": {"prompts": [{"prompt": [{"role": "admin", "content": "hi"}]}]}},
     "dataset.prompts.0.prompt"),
    ({"rewards": [{"name": "exact_match"}]}, "rewards.0.args"),  # the rows have no 'answer' column
    ({"model": {"source": "hf:x/.."}}, "model.source"),
    ({"model": {"source": "hf:./a"}}, "model.source"),
    ({"dataset": {"source": "hf:a/b/c"}}, "dataset.source"),
    ({"dataset": {"source": "hf:../data"}}, "dataset.source"),
    ({"reward_timeout_seconds": 61}, "reward_timeout_seconds"),  # over GRPO_MAX_REWARD_TIMEOUT_SECONDS
]


@pytest.mark.parametrize(("change", "param"), BAD_SPECS, ids=[str(i) for i in range(len(BAD_SPECS))])
def test_a_spec_that_would_fail_on_the_worker_is_422_naming_the_field_and_queues_nothing(
    api, api_server, job_spec, change, param
) -> None:
    before = row_counts(api_server.settings.database_url)
    response = api.post("/v1/jobs", json=job_spec(**change))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and error["param"] == param, error
    assert error["message"].startswith(f"{param}: ")
    assert row_counts(api_server.settings.database_url) == before


def test_the_finding_pattern_compiles_and_is_accepted_the_budget_contains_it(api, job_spec) -> None:
    response = api.post("/v1/jobs", json=job_spec(rewards=[CATASTROPHIC], reward_timeout_seconds=60))
    assert response.status_code == 201, response.text


def test_without_the_hub_hf_sources_are_refused_at_submit(api, api_server, api_settings_factory,
                                                          serve_api, job_spec) -> None:
    settings = api_settings_factory(api_server.settings.database_url, allow_hub=False)
    with serve_api(settings) as server, httpx.Client(base_url=server.http_url, trust_env=False, timeout=10,
                                                     headers=dict(api.headers)) as client:
        before = row_counts(settings.database_url)
        response = client.post("/v1/jobs", json=job_spec(model={"source": "hf:Qwen/Qwen2.5-0.5B"},
                                                          dataset={"source": "hf:openai/gsm8k"}))
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert [e["param"] for e in error["errors"]] == ["model.source", "dataset.source"]
        assert "GRPO_ALLOW_HUB=false" in error["message"]
        assert row_counts(settings.database_url) == before
        assert client.post("/v1/jobs", json=job_spec()).status_code == 201  # path: sources still go
    # With the hub allowed (the default), the same ids are accepted.
    assert api.post("/v1/jobs", json=job_spec(model={"source": "hf:Qwen/Qwen2.5-0.5B"})).status_code == 201
