"""Per-pool limits over real HTTP (Postgres and SQLite): the deployment's defaults refuse specs
whose fields are each in bounds but multiply to more than a shared worker should hold; admins
override them per pool; a refusal is a 422 naming the field and the limit, and queues nothing.
Lists of jobs are summaries (a spec may be a megabyte of inline rows)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from api.store import bus
from api.vocabulary import Heartbeat
from grpo_core.rewards.sandbox import CAPABILITY

LIMITS = ("max_tokens_per_step", "max_steps", "max_checkpoints_per_job", "max_inline_dataset_bytes",
          "max_sandbox_memory_bytes", "job_memory_bytes")
CODE_ROWS = [{"prompt": "Read n and print 2n.", "tests": [{"input": "2", "output": "4"}]}]
GRADER = {"name": "python", "args": {"source": "def grade(sample, item):\n    return 1.0\n"}}


@pytest.fixture
def admin(client_for, team_keys):
    return client_for(team_keys.admin)


@pytest.fixture
def own_pool(admin) -> str:
    name = f"limited-{uuid.uuid4().hex[:8]}"
    assert admin.post("/v1/admin/pools", json={"name": name}).status_code == 201
    return name


@pytest.fixture
def sandboxed_pool(api_server, own_pool) -> Iterator[str]:
    """``own_pool`` with a live worker that advertises the sandbox: without one, submit refuses a
    code_tests or python job before any limit is looked at."""
    settings, worker_id = api_server.settings, f"sandboxed-{uuid.uuid4().hex[:6]}"
    with bus.connect(settings) as client:
        bus.advertise_worker(client, settings.redis_keys,
                             Heartbeat(worker_id=worker_id, pool=own_pool, capabilities=[CAPABILITY]), 60)
        yield own_pool
        client.delete(settings.redis_keys.worker(worker_id))


def refusal(response, field: str) -> str:
    """The message of the 422's error on ``field`` (the only one, or one of ``errors``)."""
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    found = [e["message"] for e in error.get("errors", [error]) if e["param"] == field]
    assert len(found) == 1, error
    [message] = found
    return message


def count_jobs(client) -> int:
    return len(client.get("/v1/jobs", params={"limit": 100}).json()["items"])


def test_the_default_limits_refuse_what_exhausts_a_worker(alpha, job_spec) -> None:
    before = count_jobs(alpha)
    huge_batch = job_spec(grpo={"num_generations": 1024, "prompts_per_step": 4096})
    message = refusal(alpha.post("/v1/jobs", json=huge_batch), "grpo")
    assert "tokens per step" in message and "at most 8,388,608" in message
    every_step = job_spec(max_steps=1_000_000, checkpoint_every=1)
    message = refusal(alpha.post("/v1/jobs", json=every_step), "checkpoint_every")
    assert "1,000,000 checkpoints" in message and "checkpoint every 1,000 steps or more" in message
    assert count_jobs(alpha) == before  # nothing queued
    assert alpha.post("/v1/jobs", json=job_spec(max_steps=1000, checkpoint_every=1)).status_code == 201


def test_admins_set_a_pools_limits_and_submissions_are_checked_against_them(admin, alpha, own_pool,
                                                                            job_spec) -> None:
    fresh = admin.get("/v1/admin/pools").json()["items"]
    assert [p["limits"] for p in fresh if p["name"] == own_pool] == [dict.fromkeys(LIMITS)]
    body = {"max_tokens_per_step": 4096, "max_steps": 50, "max_inline_dataset_bytes": 200,
            "job_memory_bytes": 2**30}
    pool = admin.put(f"/v1/admin/pools/{own_pool}/limits", json=body)
    assert pool.status_code == 200, pool.text
    assert pool.json()["limits"] == {**dict.fromkeys(LIMITS), **body}

    def submit(**fields):
        return alpha.post("/v1/jobs", json=job_spec(pool=own_pool, **fields))

    assert "allows at most 50" in refusal(submit(max_steps=51), "grpo.max_steps")
    tokens = {"prompts_per_step": 4, "num_generations": 4, "max_prompt_length": 200,
              "max_completion_length": 100}  # 4 × 4 × 300 = 4,800
    assert "4,800 tokens per step" in refusal(submit(grpo=tokens), "grpo")
    # A generation round feeding 6 steps holds 6 steps' rows at once: 2 × 2 × 200 × 6 = 4,800.
    round_of_six = {"prompts_per_step": 2, "num_generations": 2, "max_prompt_length": 100,
                    "max_completion_length": 100, "generation_batch_size": 24}
    assert "6 steps per generation round = 4,800" in refusal(submit(grpo=round_of_six), "grpo")
    rows = [{"prompt": "x" * 100}, {"prompt": "y" * 100}]
    assert "put the rows in a dataset file" in refusal(submit(dataset={"prompts": rows}), "dataset.prompts")
    accepted = submit(max_steps=50)
    assert accepted.status_code == 201, accepted.text

    # A null field is the default again; the pool's other limits stay.
    relaxed = admin.put(f"/v1/admin/pools/{own_pool}/limits", json={**body, "max_steps": None}).json()
    assert relaxed["limits"]["max_steps"] is None and relaxed["limits"]["max_tokens_per_step"] == 4096
    assert submit(max_steps=51).status_code == 201


def test_bad_limit_requests_are_refused_and_change_nothing(admin, alpha, own_pool) -> None:
    for body, field in (({"max_steps": 0}, "max_steps"), ({"job_memory_bytes": 1000}, "job_memory_bytes"),
                        ({"max_stepz": 5}, "max_stepz"), ({"max_steps": "many"}, "max_steps")):
        response = admin.put(f"/v1/admin/pools/{own_pool}/limits", json=body)
        assert response.status_code == 422 and field in response.text, response.text
    assert admin.put("/v1/admin/pools/nowhere/limits", json={}).status_code == 404
    assert alpha.put(f"/v1/admin/pools/{own_pool}/limits", json={"max_steps": 10**6}).status_code == 403
    [pool] = [p for p in admin.get("/v1/admin/pools").json()["items"] if p["name"] == own_pool]
    assert pool["limits"] == dict.fromkeys(LIMITS)


def test_job_lists_are_summaries_and_the_spec_comes_with_the_job(alpha, job_spec) -> None:
    rows = [{"prompt": f"row {n} " + "z" * 200} for n in range(200)]
    job = alpha.post("/v1/jobs", json=job_spec(dataset={"prompts": rows})).json()
    listed = alpha.get("/v1/jobs", params={"order": "desc", "limit": 5})
    [summary] = [j for j in listed.json()["items"] if j["id"] == job["id"]]
    assert summary["spec"] is None and summary["max_steps"] == job["max_steps"]
    assert len(listed.content) < 10_000  # the 40 kB of rows stayed out
    full = alpha.get("/v1/jobs", params={"order": "desc", "limit": 5, "include": "spec"}).json()["items"]
    assert [j["spec"] for j in full if j["id"] == job["id"]] == [job["spec"]]
    assert alpha.get(f"/v1/jobs/{job['id']}").json()["spec"]["dataset"]["prompts"] == rows
    assert alpha.get("/v1/jobs", params={"include": "everything"}).status_code == 422


def test_a_run_by_epochs_over_inline_rows_is_held_to_the_step_limit_at_submit(admin, alpha, own_pool,
                                                                             job_spec) -> None:
    admin.put(f"/v1/admin/pools/{own_pool}/limits", json={"max_steps": 3})
    by_epochs = job_spec(pool=own_pool, max_steps=-1, grpo={"num_train_epochs": 2})  # 4 steps
    message = refusal(alpha.post("/v1/jobs", json=by_epochs), "grpo.max_steps")
    assert message == (f"grpo.max_steps: 4 steps (grpo.num_train_epochs = 2); pool '{own_pool}' allows "
                       "at most 3")
    # A file's prompts are counted (and the limit checked) by the worker.
    from_file = {**by_epochs, "dataset": {"source": "path:prompts.jsonl"}}
    assert alpha.post("/v1/jobs", json=from_file).status_code == 201


def sandbox_job(job_spec: Callable, pool: str, rewards: list[dict], gpus: int = 1, **grpo) -> dict:
    return job_spec(resources={"pool": pool, "gpus": gpus}, dataset={"prompts": CODE_ROWS * 8},
                    rewards=rewards, grpo=grpo)


def code_tests(**args) -> dict:
    return {"name": "code_tests", "args": args}


def test_the_default_sandbox_limit_admits_the_rewards_defaults_on_a_whole_host_not_their_extremes(
        alpha, sandboxed_pool, job_spec) -> None:
    before = count_jobs(alpha)
    huge = code_tests(parallel=16, max_processes=64, memory_mb=1024)  # 16 × (64 GiB + 16 MiB) at once
    message = refusal(alpha.post("/v1/jobs", json=sandbox_job(job_spec, sandboxed_pool, [GRADER, huge])),
                      "rewards.1.args")
    assert message == (f"rewards.1.args: code_tests's sandboxes may hold 1,048,832 MiB at once; pool "
                       f"'{sandboxed_pool}' allows at most 81,920 MiB (85,899,345,920 bytes): lower "
                       "memory_mb or max_processes or parallel")
    assert count_jobs(alpha) == before
    # Both rewards' defaults on 8 ranks: 8 × 4 × (8 × 256 + 16) MiB = 66,048 MiB.
    whole_host = sandbox_job(job_spec, sandboxed_pool, [GRADER, code_tests()], gpus=8, prompts_per_step=8)
    accepted = alpha.post("/v1/jobs", json=whole_host)
    assert accepted.status_code == 201, accepted.text


def test_a_pools_sandbox_limit_bounds_the_largest_reward_on_every_rank(admin, alpha, sandboxed_pool,
                                                                       job_spec) -> None:
    url = f"/v1/admin/pools/{sandboxed_pool}/limits"
    limits = admin.put(url, json={"max_sandbox_memory_bytes": 4 * 2**30})
    assert limits.status_code == 200 and limits.json()["limits"]["max_sandbox_memory_bytes"] == 4 * 2**30

    def submit(rewards: list[dict], gpus: int = 1):
        return alpha.post("/v1/jobs", json=sandbox_job(job_spec, sandboxed_pool, rewards, gpus))

    # The python reward's defaults: one interpreter of 4 × 512 MiB + 16 MiB of /tmp = 2,064 MiB.
    assert submit([GRADER]).status_code == 201
    message = refusal(submit([GRADER], gpus=2), "rewards.0.args")
    assert "2,064 MiB at once on each of 2 ranks (resources.gpus): 4,128 MiB" in message
    assert message.endswith("at most 4,096 MiB (4,294,967,296 bytes): lower memory_mb or max_processes or "
                            "resources.gpus")
    assert "8,256 MiB at once;" in refusal(submit([GRADER, code_tests()]), "rewards.1.args")
    # Rewards are called one after another: the largest counts, not the sum (2,064 + 528 MiB).
    assert submit([GRADER, code_tests(parallel=1, max_processes=2)]).status_code == 201
    # A rewards list without sandboxes is not held to it.
    plain = job_spec(resources={"pool": sandboxed_pool, "gpus": 2})
    assert alpha.post("/v1/jobs", json=plain).status_code == 201

    admin.put(url, json={"max_sandbox_memory_bytes": None})
    assert submit([GRADER, code_tests()], gpus=2).status_code == 201  # 16,512 MiB: the default admits it


def test_a_pools_sandbox_limit_bounds_a_tools_jobs_sandboxes(admin, alpha, sandboxed_pool, job_spec) -> None:
    from tool_models import TOOLS

    admin.put(f"/v1/admin/pools/{sandboxed_pool}/limits", json={"max_sandbox_memory_bytes": 4 * 2**30})
    # The defaults: 4 sandboxes of 16 × 256 MiB + 16 MiB of /tmp = 16,448 MiB per rank.
    spec = job_spec(resources={"pool": sandboxed_pool}, tools=[{"source": TOOLS}])
    message = refusal(alpha.post("/v1/jobs", json=spec), "tool_limits")
    assert "16,448 MiB (4 sandboxes of max_processes × memory_mb and their /tmp)" in message
    assert message.endswith("at most 4,096 MiB: lower tool_limits.memory_mb or max_processes")
    small = {**spec, "tool_limits": {"memory_mb": 64, "max_processes": 8}}  # 4 × (512 + 16) MiB
    assert alpha.post("/v1/jobs", json=small).status_code == 201
    eight_ranks = {**small, "resources": {"pool": sandboxed_pool, "gpus": 8},  # 16,896 MiB on 8 ranks
                   "grpo": {**small["grpo"], "prompts_per_step": 8}}
    assert "on 8 ranks (resources.gpus)" in refusal(alpha.post("/v1/jobs", json=eight_ranks), "tool_limits")


def dry_run(client, pool: str, rewards: list[dict]):
    samples = [{"prompt": row["prompt"], "completion": "print(2 * int(input()))",
                "columns": {"tests": row["tests"]}} for row in CODE_ROWS]
    return client.post("/v1/rewards/run", json={"rewards": rewards, "samples": samples, "pool": pool})


@pytest.mark.parametrize("reward", [
    {"name": "python", "args": {**GRADER["args"], "memory_mb": 4096, "max_processes": 64}},
    code_tests(parallel=16, max_processes=256, memory_mb=8192)], ids=["python", "code_tests"])
def test_a_rewards_dry_run_is_refused_by_the_pool_limit_as_a_job_with_its_rewards_is(
        admin, alpha, sandboxed_pool, job_spec, reward) -> None:
    job = refusal(alpha.post("/v1/jobs", json=sandbox_job(job_spec, sandboxed_pool, [reward])),
                  "rewards.0.args")
    assert refusal(dry_run(alpha, sandboxed_pool, [reward]), "rewards.0.args") == job
    assert "allows at most 81,920 MiB" in job
    # An admin's override of the pool's limit holds dry runs too: code_tests' defaults are 8,256 MiB.
    url = f"/v1/admin/pools/{sandboxed_pool}/limits"
    assert admin.put(url, json={"max_sandbox_memory_bytes": 4 * 2**30}).status_code == 200
    try:
        job = refusal(alpha.post("/v1/jobs", json=sandbox_job(job_spec, sandboxed_pool, [code_tests()])),
                      "rewards.0.args")
        assert refusal(dry_run(alpha, sandboxed_pool, [code_tests()]), "rewards.0.args") == job
        assert "8,256 MiB at once;" in job
    finally:
        admin.put(url, json={"max_sandbox_memory_bytes": None})


def test_a_pools_sandbox_limit_bounds_an_environment_jobs_episodes(admin, alpha, sandboxed_pool,
                                                                   job_spec) -> None:
    admin.put(f"/v1/admin/pools/{sandboxed_pool}/limits", json={"max_sandbox_memory_bytes": 4 * 2**30})
    source = ("class Environment:\n    def reset(self, item):\n        return None\n"
              "    def step(self, action):\n        return {'done': True}\n")
    # 2 prompts × 2 generations = 4 episodes in one sandbox: (4 × 4 + 2) processes × 256 MiB + 16 MiB.
    spec = job_spec(resources={"pool": sandboxed_pool}, rewards=[], environment={"source": source})
    message = refusal(alpha.post("/v1/jobs", json=spec), "environment")
    assert "4 episodes (prompts × num_generations) may hold 4,624 MiB" in message
    assert message.endswith("at most 4,096 MiB: lower environment.memory_mb or max_processes")
    small = {**spec, "environment": {"source": source, "memory_mb": 128}}  # 18 × 128 + 16 MiB
    assert alpha.post("/v1/jobs", json=small).status_code == 201
