"""An environment dry run (``POST /v1/environments/run``): check a spec's environment as a submit
would, then play one episode of it on scripted actions, without a model or a job.

The environment is the team's code: it runs only in the sandbox, one interpreter for the episode,
as in a job (:class:`~grpo_core.agents.environment_runner.EnvironmentEpisodes`). Where: this host's
sandbox when it has one and ``GRPO_REWARD_TRIAL_HOST`` is ``auto``, else a worker of the request's
pool that advertises ``code_sandbox``, to which the API relays the request as it relays a rewards
dry run (:mod:`api.http.reward_trial_relay`, :mod:`worker.reward_trials`). Bounded: at most
:data:`~api.schemas.environment_trials.MAX_ACTIONS` steps, each call within
:data:`~api.schemas.environment_trials.MAX_CALL_SECONDS`, the episode's sandbox held to the pool's
sandbox memory. An environment that fails as it would fail a job (it does not load, a call raises,
answers wrongly or runs over its limits) is a 422 naming ``environment`` with the job's message.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from api.limits.pool_limits import effective_limits, environment_problems
from api.schemas.admin import PoolLimits
from api.schemas.environment_trials import (
    MAX_CALL_SECONDS,
    EnvironmentStepRead,
    EnvironmentTrialRead,
    EnvironmentTrialRequest,
)
from api.settings import Settings
from api.store.db import session_scope
from api.store.pools import admission
from api.store.verifiers import endpoints_for
from api.vocabulary import DEFAULT_POOL
from grpo_core.agents.environment_runner import open_episodes
from grpo_core.agents.environment_setup import EnvironmentSetup
from grpo_core.egress import EgressPolicy
from grpo_core.errors import EnvironmentUnavailable, GRPOError, SpecError
from grpo_core.rewards.sandbox import sandbox_problem
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.spec.environment_spec import EnvironmentSpec
from grpo_core.spec.spec_file import InvalidSpec, field_path, load_yaml

__all__ = ["environment_of_spec", "run_environment_trial", "runs_on_a_worker"]


def runs_on_a_worker(request: EnvironmentTrialRequest, settings: Settings) -> bool:
    """Whether the (checked) request goes to a sandbox-capable worker (``GRPO_REWARD_TRIAL_HOST``):
    an Environment class always with ``workers``, else when this host has no sandbox of its own;
    a registered server's sessions are opened from here, through the egress guard."""
    if request.environment is None or request.environment.source is None:
        return False
    return settings.reward_trial_host == "workers" or sandbox_problem() is not None


def environment_of_spec(request: EnvironmentTrialRequest) -> EnvironmentTrialRequest:
    """The request with ``environment`` taken from its ``spec`` text (errors named
    ``environment...`` as at submit); as it is when it gave ``environment``."""
    if request.spec is None:
        return request
    try:
        data: Any = load_yaml(request.spec)
    except (yaml.YAMLError, ValueError) as exc:
        raise InvalidSpec([SpecError("spec", f"not valid JSON or YAML: {exc}")]) from None
    if not isinstance(data, dict) or not isinstance(data.get("environment"), dict):
        raise InvalidSpec([SpecError("spec", "has no `environment:` to try")])
    try:
        environment = EnvironmentSpec.model_validate(data["environment"])
    except ValidationError as exc:
        raise InvalidSpec([SpecError(field_path(("environment", *err["loc"])), err["msg"])
                           for err in exc.errors(include_url=False)]) from None
    return request.model_copy(update={"environment": environment, "spec": None})


def _refuse_over_pool_limit(environment: EnvironmentSpec, pool: str, settings: Settings) -> None:
    with session_scope(settings.database_url) as session:
        found = admission(session, pool)
    overrides = found[1] if found is not None else PoolLimits()
    limit = effective_limits(overrides, settings).max_sandbox_memory_bytes
    if limit is not None and (problems := environment_problems(environment, 1, pool, limit)):
        raise InvalidSpec(problems)


def check_environment_trial(request: EnvironmentTrialRequest, settings: Settings) -> EnvironmentTrialRequest:
    """The request with its environment read and checked as a submit would check it (the
    pool's limit on its sandbox's memory); :class:`InvalidSpec` naming the field."""
    request = environment_of_spec(request)
    assert request.environment is not None  # the schema asks for one of the two
    _refuse_over_pool_limit(request.environment, request.pool or DEFAULT_POOL, settings)
    return request


def _servers(environment: EnvironmentSpec, team_id: int, pool: str,
             settings: Settings) -> dict[str, VerifierEndpoint]:
    """The registration a server-backed environment names, when the team or pool has it."""
    if environment.server is None:
        return {}
    with session_scope(settings.database_url) as session:
        found = endpoints_for(session, {environment.server}, team_id, pool)
    if environment.server not in found:
        raise InvalidSpec([SpecError("environment.server", f"no environment server '{environment.server}' is "
                                                           f"registered for your team or pool '{pool}'")])
    return found


def play_environment_trial(request: EnvironmentTrialRequest, team_id: int,
                           settings: Settings) -> EnvironmentTrialRead:
    """The (checked) request's episode, played in this host's sandbox (an Environment class) or
    as a session of its registered server (through the egress guard)."""
    assert request.environment is not None
    if request.environment.source is not None and (missing := sandbox_problem()) is not None:
        raise InvalidSpec([SpecError("environment", f"runs in the code sandbox, and this host has none: "
                                                    f"{missing}")])
    capped = request.environment.model_copy(
        update={"timeout_seconds": min(request.environment.timeout_seconds, MAX_CALL_SECONDS)})
    servers = _servers(capped, team_id, request.pool or DEFAULT_POOL, settings)
    setup = EnvironmentSetup.of(capped, servers, EgressPolicy.from_cidrs(settings.environment_networks))
    steps: list[EnvironmentStepRead] = []
    try:
        with open_episodes(setup, [request.item]) as episode:
            for action in request.actions:
                result = episode.step({0: action})[0]
                steps.append(EnvironmentStepRead(action=action, observation=result.observation,
                                                 reward=result.reward, done=result.done))
                if result.done:
                    break
            first = episode.first_observations[0]
    except EnvironmentUnavailable as exc:  # the registered server's state, not ours: said, not a 5xx
        raise InvalidSpec([SpecError("environment.server", exc.message)]) from None
    except GRPOError as exc:
        raise InvalidSpec([SpecError("environment", exc.message)]) from None
    done = bool(steps) and steps[-1].done
    return EnvironmentTrialRead(first_observation=first, steps=steps,
                                total_reward=sum(step.reward or 0.0 for step in steps), done=done,
                                unused_actions=len(request.actions) - len(steps))


def run_environment_trial(request: EnvironmentTrialRequest, team_id: int,
                          settings: Settings) -> EnvironmentTrialRead:
    """Checked and played here: what a worker runs for a request the API relayed (checked again,
    as if it came from a client)."""
    return play_environment_trial(check_environment_trial(request, settings), team_id, settings)
