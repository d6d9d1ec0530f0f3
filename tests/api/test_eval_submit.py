"""A spec's ``eval_dataset`` at submit, over real HTTP (Postgres and SQLite): its source is
checked as ``dataset``'s (inside the data root and there, ``hf:`` only where the hub is allowed),
its inline rows must carry what the rewards read, and the pool's limits count it: its inline
rows with the training rows against the inline bytes, an eval point's tokens against the per-step
bound. Each refusal is a 422 naming the ``eval_dataset`` field and queues nothing."""

from __future__ import annotations

import httpx
import pytest
import test_pool_limits
from test_jobs_api import row_counts
from test_pool_limits import refusal

# The pool-limit tests' fixtures: an admin's client, and a pool of the test's own to limit.
admin, own_pool = test_pool_limits.admin, test_pool_limits.own_pool
EVAL = {"eval_strategy": "steps", "eval_steps": 2}
BAD_EVAL_SOURCES = [
    # (eval_dataset, the param the 422 must name)
    ({"source": "path:nope.jsonl"}, "eval_dataset.source"),
    ({"source": "path:leak.jsonl"}, "eval_dataset.source"),  # a symlink inside the root, leading out
    ({"source": "path:../outside/secret.jsonl"}, "eval_dataset.source"),
    ({"source": "hf:a/b/c"}, "eval_dataset.source"),
    ({"prompts": [{"question": "2+2?"}]}, "eval_dataset.prompts.0"),
    ({"prompts": [{"prompt": "x", "completions": "y"}]}, "eval_dataset.prompts.0.completions"),
    ({"prompts": [{"prompt": "x"}], "source": "path:prompts.jsonl"}, "eval_dataset"),
]


@pytest.mark.parametrize(("eval_dataset", "param"), BAD_EVAL_SOURCES,
                         ids=[str(i) for i in range(len(BAD_EVAL_SOURCES))])
def test_a_bad_eval_dataset_is_422_naming_it_and_queues_nothing(api, api_server, job_spec, eval_dataset,
                                                                param) -> None:
    before = row_counts(api_server.settings.database_url)
    response = api.post("/v1/jobs", json=job_spec(grpo=EVAL, eval_dataset=eval_dataset))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and error["param"] == param, error
    assert str(api_server.settings.data_root) not in error["message"]  # server paths stay private
    assert row_counts(api_server.settings.database_url) == before


def test_an_eval_file_under_the_data_root_is_accepted(api, job_spec) -> None:
    response = api.post("/v1/jobs", json=job_spec(grpo=EVAL, eval_dataset={"source": "path:prompts.jsonl"}))
    assert response.status_code == 201, response.text


def test_eval_rows_lacking_a_rewards_column_are_named_on_the_rows(api, job_spec) -> None:
    rewards = [{"name": "exact_match"}]  # reads 'answer'
    rows = [{"prompt": "2+3?", "answer": "5"}]
    accepted = job_spec(dataset={"prompts": rows}, rewards=rewards, grpo=EVAL, eval_dataset={"prompts": rows})
    assert api.post("/v1/jobs", json=accepted).status_code == 201
    lacking = {**accepted, "eval_dataset": {"prompts": [{"prompt": "2+2?"}]}}
    message = refusal(api.post("/v1/jobs", json=lacking), "eval_dataset.prompts")
    assert "rewards.0.args: needs dataset column 'answer'" in message


def test_without_the_hub_an_hf_eval_dataset_is_refused(api, api_server, api_settings_factory, serve_api,
                                                        job_spec) -> None:
    settings = api_settings_factory(api_server.settings.database_url, allow_hub=False)
    hub_eval = job_spec(grpo=EVAL, eval_dataset={"source": "hf:openai/gsm8k", "split": "test"})
    with serve_api(settings) as server, httpx.Client(base_url=server.http_url, trust_env=False, timeout=10,
                                                     headers=dict(api.headers)) as client:
        refused = client.post("/v1/jobs", json=hub_eval)
        assert "GRPO_ALLOW_HUB=false" in refusal(refused, "eval_dataset.source")
    assert api.post("/v1/jobs", json=hub_eval).status_code == 201  # the hub allowed: the same id goes


def test_the_inline_bytes_limit_counts_training_and_eval_rows_together(admin, alpha, own_pool,
                                                                      job_spec) -> None:
    assert admin.put(f"/v1/admin/pools/{own_pool}/limits", json={"max_inline_dataset_bytes": 300}
                     ).status_code == 200
    rows = [{"prompt": "x" * 100}]  # 115 bytes as JSON; twice: 229
    train_alone = job_spec(pool=own_pool, dataset={"prompts": rows * 2})
    assert alpha.post("/v1/jobs", json=train_alone).status_code == 201
    # Each set is under 300 bytes alone; together (229 + 115) they are over, and the eval rows,
    # which took the total over, are named.
    both = {**train_alone, "grpo": {**train_alone["grpo"], **EVAL}, "eval_dataset": {"prompts": rows}}
    message = refusal(alpha.post("/v1/jobs", json=both), "eval_dataset.prompts")
    assert message == (f"eval_dataset.prompts: 115 bytes of inline eval rows, 344 with dataset.prompts' 229; "
                       f"pool '{own_pool}' allows at most 300 for the two together: put the rows in a "
                       "dataset file under the data root")
    from_file = {**both, "dataset": {"source": "path:prompts.jsonl"}}
    assert alpha.post("/v1/jobs", json=from_file).status_code == 201


def test_an_eval_points_tokens_are_held_to_the_per_step_bound(admin, alpha, own_pool, job_spec) -> None:
    # A step: 2 prompts × 2 completions × (256 + 8) = 1,056 tokens, well under the bound.
    assert admin.put(f"/v1/admin/pools/{own_pool}/limits", json={"max_tokens_per_step": 2_500}
                     ).status_code == 200
    eval_rows = {"prompts": [{"prompt": f"question {n}"} for n in range(4)]}

    def submit(**grpo):
        spec = job_spec(pool=own_pool, grpo={**EVAL, **grpo}, eval_dataset=eval_rows)
        return alpha.post("/v1/jobs", json=spec)

    assert submit(eval_num_generations=2).status_code == 201  # 4 × 2 × 264 = 2,112
    message = refusal(submit(eval_num_generations=3), "eval_dataset.prompts")  # 4 × 3 × 264 = 3,168
    assert message == (
        "eval_dataset.prompts: 4 eval prompts × grpo.eval_num_generations 3 × (max_prompt_length + "
        f"max_completion_length) 264 = 3,168 tokens per eval point; pool '{own_pool}' allows at most 2,500 "
        "per step: use fewer eval prompts or lower one of them")
    # An eval_dataset that is not used (eval_strategy no) generates nothing.
    unused = job_spec(pool=own_pool, grpo={"eval_num_generations": 3}, eval_dataset=eval_rows)
    assert alpha.post("/v1/jobs", json=unused).status_code == 201
