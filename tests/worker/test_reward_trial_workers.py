"""``POST /v1/rewards/run`` with ``GRPO_REWARD_TRIAL_HOST=workers``: a dry run's sandboxed rewards
run on a real ``celery`` worker of the request's pool that advertises ``code_sandbox``, relayed
through the module's real Redis, answered by a real ``grpo api`` (:mod:`api.http.reward_trial_relay`,
:mod:`worker.reward_trials`). The same request to an API that scores in its own sandbox answers
the same; a grader that does not load is the same 422; no capable worker is a 422 naming the
reward, and a capable one that never answers is a 503 within the bound, the API answering others
meanwhile."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis
from sandbox_guard import needs_sandbox
from service_stack import Processes, settings_of
from waiting import wait_until

from api.cli.dev import free_port
from api.http.reward_trial_relay import MARGIN_SECONDS, RETRY_AFTER_SECONDS
from api.redis_keys import RedisKeys
from api.schemas.reward_trials import RewardTrialRequest
from api.store import bus
from api.trials.reward_trial_messages import RelayedTrial, request_message
from api.vocabulary import Heartbeat
from grpo_core.rewards.sandbox import CAPABILITY as SANDBOX
from worker.reward_trials import RewardTrialResponder

TOKEN = "reward-trial-operator-token-5d0c2e9a71f3"
GRADER = ("def grade(sample, item):\n"
          "    if item.get('answer') is None:\n"
          "        return None\n"
          "    return 1.0 if item['answer'] in sample['output_text'] else 0.0\n")
SAMPLES = [{"prompt": "2+2?", "completion": "it is 4", "columns": {"answer": "4"}},
           {"prompt": [{"role": "user", "content": "2+2?"}], "completion": "5", "columns": {"answer": "4"}},
           {"prompt": "2+2?", "completion": "four", "columns": {}}]


@dataclass
class Stack:
    relaying: httpx.Client  # an API with GRPO_REWARD_TRIAL_HOST=workers
    local: httpx.Client  # an API that scores in this host's own sandbox (auto, and it has one)
    pool: str  # served by one real worker that advertises the sandbox
    redis: redis.Redis
    keys: RedisKeys
    processes: Processes


def trial(client: httpx.Client, rewards: list[dict], pool: str, **fields) -> httpx.Response:
    body = {"rewards": rewards, "samples": SAMPLES, "pool": pool, **fields}
    return client.post("/v1/rewards/run", json=body)


@pytest.fixture(scope="module")
def stack(service_env, roots, redis_url, settings) -> Iterator[Stack]:
    procs = Processes(service_env, roots["logs"])
    pool = f"trial{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    try:
        procs.worker(pool)
        relaying = procs.api(TOKEN, GRPO_REWARD_TRIAL_HOST="workers")
        local = procs.api(TOKEN)
        wait_until(lambda: any(beat.pool == pool and SANDBOX in beat.capabilities
                               for beat in bus.live_workers(client, settings.redis_keys)),
                   60, "the worker to advertise the sandbox", interval=0.1, details=procs.logs)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=relaying, headers=headers, timeout=60) as one, \
                httpx.Client(base_url=local, headers=headers, timeout=60) as other:
            yield Stack(one, other, pool, client, settings.redis_keys, procs)
    finally:
        procs.stop_all()
        client.close()


@needs_sandbox
def test_a_grader_scored_on_the_worker_answers_as_the_api_hosts_own_sandbox(stack: Stack) -> None:
    queue = stack.keys.reward_trials(stack.pool)
    # Neither a message that is no request nor one nobody waits for any more stops the worker.
    stack.redis.rpush(queue, b"{not json")
    late = RelayedTrial("late-one", 1, time.time() - 1, RewardTrialRequest(
        rewards=[{"name": "python", "args": {"source": GRADER}}], samples=SAMPLES, pool=stack.pool))
    stack.redis.rpush(queue, request_message(late))
    rewards = [{"name": "python", "args": {"source": GRADER}, "weight": 2.0},
               {"name": "contains", "args": {"text": "four"}, "weight": 0.5}]
    relayed = trial(stack.relaying, rewards, stack.pool)
    assert relayed.status_code == 200, relayed.text + stack.processes.logs()
    here = trial(stack.local, rewards, stack.pool)
    assert here.status_code == 200, here.text
    assert relayed.json() == here.json()
    assert [item["rewards"] for item in relayed.json()["items"]] == [
        {"python": 1.0, "contains": 0.0}, {"python": 0.0, "contains": 0.0}, {"python": None, "contains": 1.0}]
    assert stack.redis.llen(queue) == 0
    assert not stack.redis.exists(stack.keys.reward_trial_reply("late-one"))  # dropped unanswered
    assert "dropped request late-one" in stack.processes.logs()


@needs_sandbox
def test_a_grader_that_does_not_load_on_the_worker_is_the_same_422(stack: Stack) -> None:
    # Imported by a name built at run time, which the submit-time import check cannot see.
    source = "np = __import__('numpy')\ndef grade(s, i):\n    return 1.0\n"
    broken = [{"name": "contains", "args": {"text": "4"}}, {"name": "python", "args": {"source": source}}]
    for client in (stack.relaying, stack.local):
        response = trial(client, broken, stack.pool)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_spec" and error["param"] == "rewards.1", error
        assert "does not load" in error["message"]


def test_no_live_worker_of_the_pool_with_the_sandbox_is_a_422_naming_the_reward(stack: Stack) -> None:
    lacking = f"nosandbox{uuid.uuid4().hex[:6]}"
    # A worker of this pool without the sandbox counts as none.
    bus.advertise_worker(stack.redis, stack.keys, Heartbeat(worker_id=f"{lacking}-w", pool=lacking), 60)
    rewards = [{"name": "contains", "args": {"text": "4"}}, {"name": "python", "args": {"source": GRADER}}]
    for pool in (lacking, f"nobody{uuid.uuid4().hex[:6]}"):
        response = trial(stack.relaying, rewards, pool)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "rewards.1.name" and f"no live worker of pool '{pool}'" in error["message"]
        assert stack.redis.llen(stack.keys.reward_trials(pool)) == 0  # nothing was sent
    # Rewards that need no sandbox run in the API, whatever the workers.
    plain = trial(stack.relaying, rewards[:1], f"nobody{uuid.uuid4().hex[:6]}")
    assert plain.status_code == 200 and plain.json()["items"][0]["reward"] == 1.0


def test_a_capable_worker_that_never_answers_is_a_503_within_the_bound_and_the_api_answers_others(
        stack: Stack) -> None:
    silent = f"silent{uuid.uuid4().hex[:6]}"
    bus.advertise_worker(stack.redis, stack.keys, Heartbeat(worker_id=f"{silent}-w", pool=silent,
                                                            capabilities=[SANDBOX]), 120)
    answers: list[tuple[httpx.Response, float]] = []

    def ask() -> None:
        started = time.monotonic()
        response = trial(stack.relaying, [{"name": "python", "args": {"source": GRADER}}], silent,
                         reward_timeout_seconds=1)
        answers.append((response, time.monotonic() - started))

    waiting = threading.Thread(target=ask)
    waiting.start()
    try:
        wait_until(lambda: stack.redis.llen(stack.keys.reward_trials(silent)), 10, "the request to be sent")
        for _ in range(3):  # the event loop is free while the request waits
            assert stack.relaying.get("/v1/rewards").status_code == 200
        other = trial(stack.relaying, [{"name": "contains", "args": {"text": "4"}}], silent)
        assert other.status_code == 200, other.text
        assert waiting.is_alive()
    finally:
        waiting.join(60)
    response, took = answers[0]
    bound = 1 + MARGIN_SECONDS
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "unavailable"
    assert response.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert bound - 1 <= took <= bound + 5
    # Withdrawn: no worker that comes later scores it for nobody.
    assert stack.redis.llen(stack.keys.reward_trials(silent)) == 0


def test_the_responder_outlives_a_redis_outage(service_env, caplog) -> None:
    unreachable = settings_of({**service_env, "GRPO_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    responder = RewardTrialResponder(unreachable, lambda: True)
    with caplog.at_level(logging.WARNING, logger="worker.reward_trials"):
        responder.start()
        try:
            wait_until(lambda: "Redis failed" in caplog.text, 10, "the outage to be logged")
            time.sleep(1.0)  # backing off, and trying again
            assert responder.is_alive()
        finally:
            responder.stop()
    assert not responder.is_alive()


GAME = ("class Environment:\n"
        "    def reset(self, item):\n"
        "        self.turns = 0\n"
        "        return f\"row {item['n']}\"\n"
        "    def step(self, action):\n"
        "        self.turns += 1\n"
        "        return {'observation': f'{action} at turn {self.turns}', 'reward': 0.5,\n"
        "                'done': self.turns == 2}\n")


@needs_sandbox
def test_an_environment_played_on_the_worker_answers_as_the_api_hosts_own_sandbox(stack: Stack) -> None:
    body = {"environment": {"source": GAME}, "item": {"n": 3}, "actions": ["a", "b", "c"], "pool": stack.pool}
    relayed = stack.relaying.post("/v1/environments/run", json=body)
    assert relayed.status_code == 200, relayed.text + stack.processes.logs()
    here = stack.local.post("/v1/environments/run", json=body)
    assert here.status_code == 200, here.text
    assert relayed.json() == here.json()
    episode = relayed.json()
    assert episode["first_observation"] == "row 3" and episode["unused_actions"] == 1
    assert [step["observation"] for step in episode["steps"]] == ["a at turn 1", "b at turn 2"]
    # One that fails as it would fail a job is the same 422 from the worker.
    broken = {**body, "environment": {"source": GAME.replace("self.turns += 1", "self.turns += None")}}
    for client in (stack.relaying, stack.local):
        response = client.post("/v1/environments/run", json=broken)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["param"] == "environment"
        assert "step raised TypeError" in response.json()["error"]["message"]
    # No live worker of the pool with the sandbox: a 422 naming the environment, nothing sent.
    nobody = f"nobody{uuid.uuid4().hex[:6]}"
    refused = stack.relaying.post("/v1/environments/run", json={**body, "pool": nobody})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "environment", refused.text
    assert stack.redis.llen(stack.keys.reward_trials(nobody)) == 0
