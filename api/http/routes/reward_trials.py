"""``POST /v1/rewards/run``: score a few samples with a spec's rewards, without a job
(:mod:`api.reward_trials`). The scoring runs off the event loop, a bounded number at a time."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.http.deps import PrincipalDep, SettingsDep
from api.http.spec_intake import SpecIntake
from api.reward_trials import run_trial
from api.schemas.reward_trials import RewardTrialRead, RewardTrialRequest

router = APIRouter(prefix="/rewards", tags=["rewards"])


def _slots(state: Any) -> SpecIntake:
    found = getattr(state, "reward_trials", None)
    if found is None:
        found = state.reward_trials = SpecIntake(state.settings.reward_trial_slots)
    return found


@router.post("/run", response_model=RewardTrialRead, responses={
    422: {"description": "A reward does not validate (as at submit), cannot run here, or fails as it would "
                         "fail a job (a grader that does not load): `param` names it"}})
async def run_rewards(body: RewardTrialRequest, request: Request, principal: PrincipalDep,
                      settings: SettingsDep) -> RewardTrialRead:
    """Each sample's scores, in sample order, as a training step would compute them from the same
    rewards: each reward after its clip and gate, and their weighted sum. Nothing is queued."""
    return await _slots(request.app.state).run(run_trial, body, principal.team_id, settings)
