"""``POST /v1/rewards/run``: score a few samples with a spec's rewards, without a job
(:mod:`api.trials.reward_trials`). The scoring runs off the event loop, a bounded number at a time; sandboxed
rewards may be relayed to a worker (:mod:`api.http.reward_trial_relay`), waited on without a thread.
Each team holds at most its share of dry runs at once (:mod:`api.store.trial_slots`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Request
from pydantic import Field, TypeAdapter, ValidationError

from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.http.reward_trial_relay import ask_a_worker
from api.http.spec_intake import SpecIntake, slots_on
from api.http.yaml_body import parse_yaml
from api.schemas.reward_trials import MAX_REWARDS, MAX_TRIAL_SECONDS, RewardTrialRead, RewardTrialRequest
from api.store.trial_slots import RewardTrialSlots
from api.trials.reward_trials import check_trial, runs_on_a_worker, score_trial
from grpo_core.errors import SpecError
from grpo_core.spec.run_spec import RewardSpec
from grpo_core.spec.spec_file import InvalidSpec, field_path

_REWARDS = TypeAdapter(Annotated[list[RewardSpec], Field(min_length=1, max_length=MAX_REWARDS)])

router = APIRouter(prefix="/rewards", tags=["rewards"])


def trial_slots(state: Any) -> SpecIntake:
    return slots_on(state, "reward_trials", state.settings.reward_trial_slots)


@asynccontextmanager
async def team_share(request: Request, principal: Any, settings: Any) -> AsyncIterator[None]:
    """One of the caller's team's dry runs held, rewards' and environments' alike, for as long
    as the block runs (a relayed one's wait included)."""
    if principal.is_admin:  # as for the other per-team limits: admin keys are the operator's
        yield
        return
    share = settings.reward_trial_slots_per_team
    async with team_trial_slots(request.app.state).held(principal.team_id, share):
        yield


def team_trial_slots(state: Any) -> RewardTrialSlots:
    """The process's handle on the teams' shares (``app.state``), made on first use."""
    found = getattr(state, "reward_trial_team_slots", None)
    if found is None:
        found = state.reward_trial_team_slots = RewardTrialSlots(state.redis, state.settings.redis_keys)
    return found


# What any dry run may answer besides its 200 and its own 422s.
TRIAL_RESPONSES: dict[int | str, dict[str, Any]] = {
    429: {"description": "`rate_limited`: the team already has `GRPO_REWARD_TRIAL_SLOTS_PER_TEAM` dry runs "
                         "in progress (Retry-After says when to try again)"},
    503: {"description": "`unavailable`: no sandbox-capable worker of the pool answered in time "
                         "(Retry-After says when to try again)"}}


@router.post("/run", response_model=RewardTrialRead, responses={
    **TRIAL_RESPONSES,
    422: {"description": "A reward does not validate (as at submit), cannot run here, or fails as it would "
                         "fail a job (a grader that does not load): `param` names it; or it needs the code "
                         "sandbox and no live worker of the pool advertises one"}})
async def run_rewards(body: RewardTrialRequest, request: Request, principal: PrincipalDep,
                      settings: SettingsDep, redis: RedisDep) -> RewardTrialRead:
    """Each sample's scores, in sample order, as a training step would compute them from the same
    rewards: each reward after its clip and gate, and their weighted sum. Nothing is queued.
    Sandboxed rewards run where a sandbox is (``GRPO_REWARD_TRIAL_HOST``). A team has at most
    ``GRPO_REWARD_TRIAL_SLOTS_PER_TEAM`` in progress, held from here to its answer (a relayed one's
    wait included), so it cannot take the slots another team's dry run needs."""
    async with team_share(request, principal, settings):
        return await score_or_relay(body, request, principal.team_id, settings, redis)


async def score_or_relay(body: RewardTrialRequest, request: Request, team_id: int, settings: Any,
                         redis: Any) -> RewardTrialRead:
    """The dry run in one of this process's slots, or relayed to a sandbox-capable worker; the
    caller holds the team's share (:func:`team_share`)."""
    done = await trial_slots(request.app.state).run(_trial, body, team_id, settings)
    if isinstance(done, RewardTrialRead):
        return done
    return await ask_a_worker(redis, settings, done, team_id)


def _trial(body: RewardTrialRequest, team_id: int, settings: Any) -> RewardTrialRead | RewardTrialRequest:
    """In the slot's thread: a spec's text parsed (YAML costs CPU) and the rewards checked, then
    the dry run here, or the checked request to relay to a worker (waited on off the thread)."""
    if body.spec is not None:
        body = body.model_copy(update={**rewards_of_spec(body.spec), "spec": None})
    verifiers = check_trial(body, team_id, settings)
    if runs_on_a_worker(body, settings):
        return body
    return score_trial(body, verifiers)


def rewards_of_spec(text: str) -> dict[str, Any]:
    """``rewards`` (validated, errors named ``rewards.N...`` as at submit) and, when the spec sets
    one, ``reward_timeout_seconds`` (a dry run's own limit of 30 s caps it) from a spec's text."""
    try:
        data = parse_yaml(text.encode("utf-8"))
    except (yaml.YAMLError, ValueError) as exc:
        raise InvalidSpec([SpecError("spec", f"not valid JSON or YAML: {exc}")]) from None
    if not isinstance(data, dict) or not isinstance(data.get("rewards"), list) or not data["rewards"]:
        raise InvalidSpec([SpecError("spec", "has no `rewards:` list to try")])
    try:
        rewards = _REWARDS.validate_python(data["rewards"])
    except ValidationError as exc:
        raise InvalidSpec([SpecError(field_path(("rewards", *err["loc"])), err["msg"])
                           for err in exc.errors(include_url=False)]) from None
    found: dict[str, Any] = {"rewards": rewards}
    timeout = data.get("reward_timeout_seconds")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        found["reward_timeout_seconds"] = min(float(timeout), MAX_TRIAL_SECONDS)
    return found
