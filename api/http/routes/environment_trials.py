"""``POST /v1/environments/run``: play one episode of a spec's environment on scripted actions,
without a model or a job (:mod:`api.trials.environment_trials`). It runs off the event loop in one
of the dry runs' slots, or is relayed to a sandbox-capable worker of its pool and waited on without
a thread (:mod:`api.http.reward_trial_relay`). A team holds at most its share of dry runs at once,
rewards and environments together (:mod:`api.store.trial_slots`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.http.reward_trial_relay import ask_a_worker
from api.http.routes.reward_trials import TRIAL_RESPONSES, team_share, trial_slots
from api.schemas.environment_trials import EnvironmentTrialRead, EnvironmentTrialRequest
from api.trials.environment_trials import check_environment_trial, play_environment_trial, runs_on_a_worker

router = APIRouter(prefix="/environments", tags=["environments"])


@router.post("/run", response_model=EnvironmentTrialRead, responses={
    **TRIAL_RESPONSES,
    422: {"description": "The environment does not validate (as at submit), or fails as it would fail a "
                         "job (it does not load, a call raises, answers wrongly or runs over its limits): "
                         "`param` names it; or no live worker of the pool advertises the code sandbox"}})
async def run_environment(body: EnvironmentTrialRequest, request: Request, principal: PrincipalDep,
                          settings: SettingsDep, redis: RedisDep) -> EnvironmentTrialRead:
    """What the environment gives back: ``reset(item)``'s first observation, then ``step`` on each
    action in turn until it says it is done (each step's observation, reward and done), as an
    episode of a job would get them. Nothing is queued; the environment runs in the sandbox."""
    async with team_share(request, principal, settings):
        return await _run(body, request, settings, redis, principal.team_id)


async def _run(body: EnvironmentTrialRequest, request: Request, settings: Any, redis: Any,
               team_id: int) -> EnvironmentTrialRead:
    done = await trial_slots(request.app.state).run(_trial, body, team_id, settings)
    if isinstance(done, EnvironmentTrialRead):
        return done
    answer = await ask_a_worker(redis, settings, done, team_id)
    assert isinstance(answer, EnvironmentTrialRead)
    return answer


def _trial(body: EnvironmentTrialRequest, team_id: int,
           settings: Any) -> EnvironmentTrialRead | EnvironmentTrialRequest:
    """In the slot's thread: the spec's text parsed and the environment checked, then the episode
    here, or the checked request to relay to a worker (waited on off the thread)."""
    checked = check_environment_trial(body, settings)
    if runs_on_a_worker(checked, settings):
        return checked
    return play_environment_trial(checked, team_id, settings)
