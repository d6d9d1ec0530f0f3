"""Submit-time checks of the issue-15 rewards over real HTTP: a reward model's source is checked
like model.source (inside the models root, a model folder, the hub only where allowed), and bad
args, gates and clips are 422s naming ``rewards.N.<field>``, with nothing queued."""

from __future__ import annotations

import httpx
import pytest
from test_jobs_api import row_counts

ROWS = {"prompts": [{"prompt": "2+3?", "answer": "5"}]}
BAD_REWARDS = [
    ([{"name": "reward_model", "args": {"model": "path:missing"}}], "rewards.0.args.model"),
    ([{"name": "reward_model", "args": {"model": "path:escape"}}], "rewards.0.args.model"),
    ([{"name": "reward_model", "args": {"model": "path:../outside"}}], "rewards.0.args.model"),
    ([{"name": "reward_model", "args": {"model": "job:1"}}], "rewards.0.args.model"),  # no such model
    ([{"name": "reward_model", "args": {"model": "job:0"}}], "rewards.0.args.model"),  # malformed
    ([{"name": "reward_model", "args": {"model": "path:tiny", "batch_size": 0}}],
     "rewards.0.args.batch_size"),
    ([{"name": "reward_model", "args": {"model": "path:tiny", "logit_index": -1}}],
     "rewards.0.args.logit_index"),
    ([{"name": "reward_model", "args": {"model": "path:tiny", "max_length": 10**9}}],
     "rewards.0.args.max_length"),
    ([{"name": "text_similarity", "args": {"metric": "cider"}}], "rewards.0.args.metric"),
    ([{"name": "text_similarity", "args": {"reference_field": "gold"}}], "rewards.0.args"),
    ([{"name": "json_valid"}, {"name": "contains", "args": {"text": "x"}, "gate_by": "format"}],
     "rewards.1.gate_by"),
    ([{"name": "json_valid", "clip_min": 2, "clip_max": 1}], "rewards.0.clip_min"),
    ([{"name": "json_valid", "gate_threshold": 1}], "rewards.0.gate_threshold"),
]


@pytest.mark.parametrize(("rewards", "param"), BAD_REWARDS, ids=[str(i) for i in range(len(BAD_REWARDS))])
def test_bad_new_reward_specs_are_422_naming_the_field(api, api_server, job_spec, rewards, param) -> None:
    before = row_counts(api_server.settings.database_url)
    response = api.post("/v1/jobs", json=job_spec(rewards=rewards, dataset=ROWS))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and error["param"] == param, error
    assert row_counts(api_server.settings.database_url) == before


def test_good_new_reward_specs_are_accepted(api, job_spec) -> None:
    rewards = [
        {"name": "json_valid"},
        {"name": "reward_model", "args": {"model": "path:tiny", "batch_size": 4}, "clip_min": -1,
         "clip_max": 1, "gate_by": "json_valid", "gate_threshold": 0.5},
        {"name": "text_similarity", "args": {"metric": "bleu"}, "weight": 0.5},
    ]
    response = api.post("/v1/jobs", json=job_spec(rewards=rewards, dataset=ROWS))
    assert response.status_code == 201, response.text


def test_without_the_hub_a_hub_reward_model_is_refused(api, api_server, api_settings_factory,
                                                       serve_api, job_spec) -> None:
    rewards = [{"name": "reward_model", "args": {"model": "hf:OpenAssistant/reward-model"}}]
    settings = api_settings_factory(api_server.settings.database_url, allow_hub=False)
    with serve_api(settings) as server, httpx.Client(base_url=server.http_url, trust_env=False, timeout=10,
                                                     headers=dict(api.headers)) as client:
        response = client.post("/v1/jobs", json=job_spec(rewards=rewards))
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "rewards.0.args.model" and "GRPO_ALLOW_HUB=false" in error["message"]
    assert api.post("/v1/jobs", json=job_spec(rewards=rewards)).status_code == 201


def test_the_catalog_serves_the_new_rewards_with_their_args(api) -> None:
    items = {item["name"]: item for item in api.get("/v1/rewards").json()["items"]}
    model_args = items["reward_model"]["args_schema"]
    assert model_args["required"] == ["model"]
    assert {"model", "batch_size", "max_length", "logit_index", "completion"} <= set(model_args["properties"])
    assert model_args["properties"]["batch_size"]["maximum"] == 1024
    metric = items["text_similarity"]["args_schema"]["properties"]["metric"]
    assert metric["enum"] == ["fuzzy_ratio", "bleu", "rouge_l"]
