"""A dry run whose sandboxed code runs on a worker: a rewards dry run's sandboxed rewards
(:func:`api.trials.reward_trials.runs_on_a_worker`), an environment dry run's episode
(:func:`api.trials.environment_trials.runs_on_a_worker`). The API pushes the request onto its pool's
list (``RedisKeys.reward_trials``), a worker of that pool that advertises ``code_sandbox`` pops it
and pushes its answer to the request's reply key
(:mod:`worker.reward_trials`; the messages: :mod:`api.trials.reward_trial_messages`).

The API waits on the reply with the app's async Redis client, so the wait holds neither the event
loop nor a thread: in short BLPOPs (each within the client's socket timeout) until the request's
deadline, the time its code may take plus a margin. No live worker of the pool advertising the
sandbox is the request's problem (a 422 naming ``rewards.N.name`` or ``environment``, as at submit);
one advertised
that does not answer in time is the service's (a 503 ``unavailable`` with Retry-After).
"""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aioredis

from api.domain.errors import Unavailable
from api.http.submission import capability_problems, offered_capabilities
from api.schemas.environment_trials import MAX_CALL_SECONDS, EnvironmentTrialRequest
from api.schemas.reward_trials import RewardTrialRequest
from api.settings import Settings
from api.store import bus
from api.trials.reward_trial_messages import (
    RelayedTrial,
    TrialRead,
    TrialRequest,
    read_answer,
    request_message,
)
from api.vocabulary import DEFAULT_POOL, Heartbeat
from grpo_core.errors import SpecError
from grpo_core.rewards.sandbox import CAPABILITY as SANDBOX_CAPABILITY
from grpo_core.spec.spec_file import InvalidSpec

__all__ = ["RETRY_AFTER_SECONDS", "answer_bound", "ask_a_worker"]

# Beyond the rewards' own budgets: the worker's pop, the sandbox's start per grader, the replies.
MARGIN_SECONDS = 10.0
# A worker busy with other dry runs frees up within about one of them.
RETRY_AFTER_SECONDS = 10


def answer_bound(request: TrialRequest) -> float:
    """The longest the API waits for a worker's answer: each reward's call may take its whole
    budget, one after the other; an episode's reset and each step theirs."""
    if isinstance(request, EnvironmentTrialRequest):
        assert request.environment is not None  # the API read the spec's text before relaying
        calls = 1 + len(request.actions)
        return calls * min(request.environment.timeout_seconds, MAX_CALL_SECONDS) + MARGIN_SECONDS
    return len(request.rewards or []) * request.reward_timeout_seconds + MARGIN_SECONDS


def _unrunnable(request: TrialRequest, pool: str, live: list[Heartbeat]) -> list[SpecError]:
    """What no live worker of ``pool`` can run: as a submit says it."""
    if isinstance(request, RewardTrialRequest):
        return capability_problems(request.rewards or [], pool, live)
    if SANDBOX_CAPABILITY in offered_capabilities(pool, live):
        return []
    return [SpecError("environment", f"an environment runs in the sandbox, and no live worker of pool "
                                     f"'{pool}' advertises '{SANDBOX_CAPABILITY}' (GET /v1/cluster lists "
                                     "each worker's capabilities)")]


async def ask_a_worker(client: aioredis.Redis, settings: Settings, request: TrialRequest,
                       team_id: int) -> TrialRead:
    """The worker's answer: the scores or the episode, :class:`InvalidSpec` as a dry run here
    would raise it, or :class:`Unavailable` when no worker answered within :func:`answer_bound`."""
    keys, pool = settings.redis_keys, request.pool or DEFAULT_POOL
    live = await bus.live_workers_async(client, keys)
    if problems := _unrunnable(request, pool, live):
        raise InvalidSpec(problems)
    trial = RelayedTrial(id=uuid.uuid4().hex, team_id=team_id, deadline=time.time() + answer_bound(request),
                         request=request)
    message = request_message(trial)
    await client.rpush(keys.reward_trials(pool), message)
    answer = await _wait_for_answer(client, keys.reward_trial_reply(trial.id), trial.deadline,
                                    settings.stream_block_seconds)
    if answer is None:
        # Not taken yet: no worker should score it for nobody (one that took it drops it by its deadline).
        await client.lrem(keys.reward_trials(pool), 1, message)
        raise Unavailable(f"no worker of pool '{pool}' that advertises the code sandbox answered within "
                          f"{answer_bound(request):g} s (all busy, or stopping); retry shortly",
                          retry_after=RETRY_AFTER_SECONDS)
    return read_answer(answer, request)


async def _wait_for_answer(client: aioredis.Redis, reply_key: str, deadline: float,
                           block_seconds: float) -> bytes | None:
    # One BLPOP must end within the client's socket timeout (stream_block_seconds + 1), or a quiet
    # wait would read as a dead connection; and it must not round down to 0 ms, which blocks forever.
    while (left := deadline - time.time()) > 0:
        popped = await client.blpop([reply_key], timeout=max(min(left, block_seconds), 0.01))
        if popped is not None:
            return popped[1]
    return None
