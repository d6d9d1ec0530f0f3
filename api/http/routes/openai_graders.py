"""OpenAI's grader endpoints at its paths: ``POST /v1/fine_tuning/alpha/graders/validate`` and
``/run``, so a team's grader JSON and the ``openai`` client's ``client.fine_tuning.alpha.graders``
calls work here unchanged.

Both are the rewards dry run (:mod:`api.http.routes.reward_trials`) seen through OpenAI's shapes:
the grader becomes the ``rewards:`` entry a job would get
(:func:`grpo_core.spec.openai_graders.rewards_from_openai_grader`), is checked as a submit checks
it, and ``run`` scores the one sample where a dry run scores (the API host's sandbox, or a
sandbox-capable worker of the pool), in the team's share of dry runs. So what a job would refuse
or score differently, these endpoints do too: a judge model (``score_model``, ``label_model``)
is checked but not run, as a dry run loads no model. Errors name the grader's own fields
(``grader.operation``), not the ``rewards.0.args`` they became.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.http.routes.reward_trials import TRIAL_RESPONSES, score_or_relay, team_share
from api.schemas.openai_graders import (
    GraderRunErrors,
    GraderRunMetadata,
    GraderRunRead,
    GraderRunRequest,
    GraderValidateRead,
    GraderValidateRequest,
)
from api.schemas.reward_trials import RewardTrialRequest, TrialSampleIn
from api.trials.reward_trials import check_trial
from grpo_core.errors import SpecError
from grpo_core.rewards.templates import MissingValue, render, sample_of
from grpo_core.spec.openai_graders import rewards_from_openai_grader
from grpo_core.spec.prompt_rows import chat_prompt, prompt_problem
from grpo_core.spec.spec_file import InvalidSpec

router = APIRouter(prefix="/fine_tuning/alpha/graders", tags=["openai"])
_REWARD = "rewards.0."
_PROMPT_KEYS = ("messages", "prompt")  # where an item holds its prompt, OpenAI's name first


def _grader_field(field: str) -> str:
    """A dry run's field (``rewards.0.args.operation``) as the grader's (``grader.operation``)."""
    if field == f"{_REWARD}name":
        return "grader.type"
    for prefix in (f"{_REWARD}args.", _REWARD):
        if field.startswith(prefix):
            return "grader." + field.removeprefix(prefix)
    return "grader" if field.startswith("rewards") else field


def _as_grader_errors(exc: InvalidSpec) -> InvalidSpec:
    return InvalidSpec([SpecError(_grader_field(err.field), err.reason) for err in exc.errors])


def _trial_request(body: GraderValidateRequest, sample: TrialSampleIn) -> RewardTrialRequest:
    try:
        rewards = rewards_from_openai_grader(body.grader)
    except SpecError as exc:
        field = f"grader.{exc.field}" if exc.field else "grader"
        raise InvalidSpec([SpecError(field, exc.reason)]) from None
    try:
        return RewardTrialRequest.model_validate({"rewards": rewards, "samples": [sample.model_dump()]})
    except ValueError as exc:  # pydantic's ValidationError is one
        raise InvalidSpec([SpecError("grader", str(exc))]) from None


def _sample(model_sample: str, item: dict[str, Any]) -> TrialSampleIn:
    """The item as a dataset row: its prompt (``messages`` or ``prompt``) and its other fields as
    columns, which is what ``{{item.*}}`` and a python grader's ``item`` read."""
    prompt: Any = ""
    for key in _PROMPT_KEYS:
        if isinstance(item.get(key), str | list) and item[key]:
            # OpenAI's developer role and text parts read as a dataset row's would be.
            prompt = chat_prompt(item[key]) if prompt_problem(item[key]) is None else item[key]
            break
    columns = {name: value for name, value in item.items() if name not in _PROMPT_KEYS}
    try:
        return TrialSampleIn.model_validate({"prompt": prompt, "completion": model_sample,
                                             "columns": columns})
    except ValueError as exc:
        raise InvalidSpec([SpecError("item", str(exc))]) from None


@router.post("/validate", response_model=GraderValidateRead, responses={
    422: {"description": "The grader is not one this service runs, or a field of it is wrong (as a job's "
                         "submit would say): `param` names it (`grader.operation`)"}})
async def validate_grader(body: GraderValidateRequest, principal: PrincipalDep,
                          settings: SettingsDep) -> GraderValidateRead:
    """The grader back when a job could use it: it converts to a reward and that reward's args
    check as at submit (templates, operations, metrics, a python grader's source)."""
    await _checked(_trial_request(body, TrialSampleIn(prompt="", completion="")), principal.team_id, settings)
    return GraderValidateRead(grader=body.grader)


async def _checked(trial: RewardTrialRequest, team_id: int, settings: Any) -> None:
    """The grader's reward checked as a submit checks it (off the loop: it may read the pools),
    but for the item fields it reads: no item was given, or the one given lacks them."""
    try:
        await run_in_threadpool(check_trial, trial, team_id, settings, False)
    except InvalidSpec as exc:
        raise _as_grader_errors(exc) from None


def _templates(value: Any) -> Iterator[str]:
    """Every template string in a grader (its ``input``, ``reference``, messages' contents...)."""
    if isinstance(value, str) and "{{" in value:
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _templates(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _templates(inner)


def _missing_variable(grader: dict[str, Any], sample: TrialSampleIn) -> str | None:
    """Why a template of the grader cannot be rendered for this sample, if one cannot (a python
    grader's source is code, not a template)."""
    item = {**sample.columns, "prompt": sample.prompt_value()}
    for template in _templates({k: v for k, v in grader.items() if k != "source"}):
        try:
            render(template, sample_of(sample.completion), item)
        except MissingValue as exc:
            return str(exc)
        except ValueError:
            continue  # a malformed reference: the check before the run named it
    return None


@router.post("/run", response_model=GraderRunRead, responses={
    **TRIAL_RESPONSES,
    422: {"description": "The grader does not validate (see `/validate`), names a judge model (a dry run "
                         "loads none), or fails as it would fail a job: `param` names the field"}})
async def run_grader(body: GraderRunRequest, request: Request, principal: PrincipalDep,
                     settings: SettingsDep, redis: RedisDep) -> GraderRunRead:
    """The grader's score of ``model_sample`` for ``item``, as a training step would score that
    row; an unscorable sample is a reward of 0 with the reason among ``metadata.errors``."""
    sample = _sample(body.model_sample, body.item or {})
    trial = _trial_request(body, sample)
    kind = str(body.grader.get("type"))
    started = time.monotonic()
    errors = GraderRunErrors()
    if _missing_variable(body.grader, sample) is not None:
        # OpenAI's answer for an item without a field a template reads; a job's submit would
        # instead refuse a dataset that lacks the column. The grader itself is checked first, as
        # a run that goes ahead checks it.
        await _checked(trial, principal.team_id, settings)
        errors.invalid_variable_error = True
        return _answer(body.grader, kind, None, {}, errors, started)
    async with team_share(request, principal, settings):
        try:
            answer = await score_or_relay(trial, request, principal.team_id, settings, redis)
        except InvalidSpec as exc:
            raise _as_grader_errors(exc) from None
    scores = answer.items[0]
    if scores.reward is None:
        problem = "; ".join(scores.problems.values()) or None
        if kind == "python":
            errors.python_grader_runtime_error = True
            errors.python_grader_runtime_error_details = problem
        elif problem is not None and "time" in problem:
            errors.unresponsive_reward_error = True
        else:
            errors.other_error = True
    return _answer(body.grader, kind, scores.reward, scores.rewards, errors, started)


def _answer(grader: dict[str, Any], kind: str, reward: float | None, scores: dict[str, float | None],
            errors: GraderRunErrors, started: float) -> GraderRunRead:
    return GraderRunRead(
        reward=reward if reward is not None else 0.0, sub_rewards={},
        metadata=GraderRunMetadata(name=str(grader.get("name") or kind), type=kind, errors=errors,
                                   execution_time=round(time.monotonic() - started, 6), scores=dict(scores)))
