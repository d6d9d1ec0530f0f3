"""The worker's side of a relayed dry run (:mod:`api.http.reward_trial_relay`): a thread of the
Celery main process pops the dry runs of the worker's pool (``RedisKeys.reward_trials``) while the
worker advertises ``code_sandbox``, runs each in this host's sandbox exactly as the API would — a
rewards dry run by :func:`api.trials.reward_trials.run_trial` (the same checks, ``reward_model``
refused, the team's verifiers looked up in SQL), an environment's by
:func:`api.trials.environment_trials.run_environment_trial` — and pushes the answer to the
request's reply key.

One request at a time. The scoring path is torch-free (a grader runs as a sandboxed process),
so the main process, which forks the job children, still never imports torch. A request whose
deadline passed is dropped unanswered: nobody waits for it. Nothing a request holds, nor a Redis
or database outage, ends the thread: it logs, backs off and goes on, until the heartbeat stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from api.schemas.environment_trials import EnvironmentTrialRequest
from api.settings import Settings
from api.store import bus
from api.trials.environment_trials import run_environment_trial
from api.trials.reward_trial_messages import RelayedTrial, answer_of, error_answer, read_request
from api.trials.reward_trials import run_trial
from grpo_core.spec.spec_file import InvalidSpec

log = logging.getLogger(__name__)

# An answer no API took (it gave up at the deadline) goes soon after.
REPLY_TTL_SECONDS = 60
MAX_BACKOFF_SECONDS = 10.0


class RewardTrialResponder:
    """``start()`` / ``stop()`` next to the worker's heartbeat. ``advertises()``: whether the
    worker advertises the sandbox now (its checks run again while it lives); while it does not,
    the thread pops nothing, so another worker of the pool takes the requests."""

    def __init__(self, settings: Settings, advertises: Callable[[], bool]) -> None:
        self.settings = settings
        self.client = bus.connect(settings)
        self.queue = settings.redis_keys.reward_trials(settings.pool)
        self.advertises = advertises
        # A pop must end within the client's socket timeout, and soon enough for a prompt stop.
        self.block_seconds = min(1.0, bus.client_timeouts(settings).socket / 2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="grpo-reward-trials", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stops taking requests; one being scored finishes in its daemon thread (the process
        may exit first: the API then answers 503 at the request's deadline)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.block_seconds + 1)

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self.serve_one()
                failures = 0
            except RedisError as exc:
                failures += 1
                delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(failures, 10))
                log.warning("rewards dry runs: Redis failed (%s); trying again in %.1f s", exc, delay)
                self._stop.wait(delay)
            except Exception:  # noqa: BLE001 - one bad request must not end the worker's dry runs
                log.exception("rewards dry runs: a request failed on this worker")

    def serve_one(self) -> bool:
        """Wait up to ``block_seconds`` for one request and answer it; whether one was answered."""
        if not self.advertises():
            self._stop.wait(self.block_seconds)
            return False
        popped = self.client.blpop([self.queue], timeout=self.block_seconds)
        if popped is None:
            return False
        try:
            trial = read_request(popped[1])
        except ValueError as exc:
            log.warning("rewards dry runs: dropped a message: %s", exc)
            return False
        if trial.expired():
            log.info("rewards dry runs: dropped request %s, its deadline passed", trial.id)
            return False
        self._reply(trial, _answer(trial, self.settings))
        return True

    def _reply(self, trial: RelayedTrial, answer: str) -> None:
        reply_key = self.settings.redis_keys.reward_trial_reply(trial.id)
        with self.client.pipeline() as pipe:
            pipe.rpush(reply_key, answer)
            pipe.expire(reply_key, REPLY_TTL_SECONDS)
            pipe.execute()


def _answer(trial: RelayedTrial, settings: Settings) -> str:
    try:
        if isinstance(trial.request, EnvironmentTrialRequest):
            return answer_of(run_environment_trial(trial.request, trial.team_id, settings))
        return answer_of(run_trial(trial.request, trial.team_id, settings))
    except InvalidSpec as exc:
        return error_answer(exc)
