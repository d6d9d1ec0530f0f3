"""A rewards dry run (``POST /v1/rewards/run``): check a spec's rewards as a submit would, then
score a few samples with them, without queueing a job.

Bounded in samples (:data:`api.schemas.reward_trials.MAX_SAMPLES`) and in time (each reward's call
has the request's ``reward_timeout_seconds``, at most 30 s). Rewards run where they would in a
job's process, minus what needs a model: ``reward_model`` is refused (loading a model per request
would hold the host's memory). A team's ``http_verifier`` reaches the verifiers registered for it
or the pool, as its jobs would.

Where it runs (:func:`runs_on_a_worker`, ``GRPO_REWARD_TRIAL_HOST``): rewards that need no sandbox
run in the API, in a thread off the event loop (the route takes one of
``GRPO_REWARD_TRIAL_SLOTS``). Sandboxed ones (``python``, ``code_tests``) run where the sandbox
is: the API host's own when it has one (``auto``), else (or always, with ``workers``) a worker of
the request's pool that advertises ``code_sandbox``, to which the API relays the checked request
(:mod:`api.http.reward_trial_relay`, :mod:`worker.reward_trials`). The API checks
(:func:`check_trial`) before it scores or relays, so a bad reward is a 422 without a round trip;
the worker runs all of :func:`run_trial` again, checks included (what it pops from Redis is
trusted no more than a client), and the binding and scoring (:func:`score_trial`) are the same
code on either host.
"""

from __future__ import annotations

from api.limits.pool_limits import effective_limits, sandbox_problems
from api.schemas.admin import PoolLimits
from api.schemas.reward_trials import RewardTrialRead, RewardTrialRequest, SampleScoresRead
from api.settings import Settings
from api.store.db import session_scope
from api.store.pools import admission
from api.store.verifiers import endpoints_for
from api.vocabulary import DEFAULT_POOL
from grpo_core.errors import RewardFailed, SpecError
from grpo_core.rewards import (
    RewardContext,
    bind_rewards,
    model_sources,
    required_capabilities,
    sandbox_footprints,
    validate_reward_specs,
)
from grpo_core.rewards.http_verifier import verifier_names
from grpo_core.rewards.sandbox import sandbox_problem
from grpo_core.rewards.trial import TrialSample, score_samples
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.spec.run_spec import RewardSpec, reward_names
from grpo_core.spec.spec_file import InvalidSpec

__all__ = ["check_trial", "run_trial", "runs_on_a_worker", "score_trial"]


def runs_on_a_worker(request: RewardTrialRequest, settings: Settings) -> bool:
    """Whether the request goes to a sandbox-capable worker of its pool (``GRPO_REWARD_TRIAL_HOST``):
    only when a reward runs in the code sandbox (``python``, ``code_tests``), and then always with
    ``workers``, else (``auto``) when this host has no sandbox of its own. The rest is cheap and
    trusted, and runs here."""
    if not required_capabilities(request.rewards or []):
        return False
    return settings.reward_trial_host == "workers" or sandbox_problem() is not None


def _refuse_models(specs: list[RewardSpec]) -> None:
    problems = [SpecError(field, "names a model to load; a dry run scores without loading models "
                                 "(try it with `grpo train` or in a job)")
                for field, _ in model_sources(specs)]
    if problems:
        raise InvalidSpec(problems)


def _refuse_without_sandbox(specs: list[RewardSpec]) -> None:
    needed = required_capabilities(specs)
    missing = sandbox_problem() if needed else None
    problems = [SpecError(f"rewards.{index}.name",
                          f"'{specs[index].name}' needs the '{capability}' sandbox, and this host has "
                          f"none: {missing}")
                for index, capability in needed if missing is not None]
    if problems:
        raise InvalidSpec(problems)


def _refuse_over_pool_limits(specs: list[RewardSpec], pool: str, settings: Settings) -> None:
    """The pool's limit on sandbox memory, as a job of the pool is held to it at submit
    (:func:`api.limits.pool_limits.sandbox_problems`, one rank: a dry run scores in one process). A
    pool nobody registered has the deployment's defaults (its dry run goes nowhere anyway)."""
    if not sandbox_footprints(specs):
        return
    with session_scope(settings.database_url) as session:
        found = admission(session, pool)
    overrides = found[1] if found is not None else PoolLimits()
    limit = effective_limits(overrides, settings).max_sandbox_memory_bytes
    if limit is not None and (problems := sandbox_problems(specs, pool, 1, limit)):
        raise InvalidSpec(problems)


def _verifiers(specs: list[RewardSpec], team_id: int, pool: str,
               settings: Settings) -> dict[str, VerifierEndpoint]:
    named = verifier_names(specs)
    if not named:
        return {}
    with session_scope(settings.database_url) as session:
        usable = endpoints_for(session, set(named.values()), team_id, pool)
    missing = [SpecError(f"rewards.{index}.args.verifier",
                         f"no verifier '{name}' is registered for your team or pool '{pool}'")
               for index, name in named.items() if name not in usable]
    if missing:
        raise InvalidSpec(missing)
    return usable


def _columns(request: RewardTrialRequest) -> set[str]:
    return {name for sample in request.samples for name in sample.columns}


def check_trial(request: RewardTrialRequest, team_id: int, settings: Settings,
                with_columns: bool = True) -> dict[str, VerifierEndpoint]:
    """What a submit would refuse (the rewards' args, the pool's limit on their sandboxes' memory,
    and unless ``with_columns`` is false, a column the samples lack), and models:
    :class:`InvalidSpec` naming each field. The verifiers the team's ``http_verifier`` rewards may
    reach, when they all are registered."""
    specs = request.rewards or []
    try:
        validate_reward_specs(specs, _columns(request) if with_columns else None)
    except SpecError as exc:
        raise InvalidSpec([exc]) from None
    _refuse_models(specs)
    pool = request.pool or DEFAULT_POOL
    _refuse_over_pool_limits(specs, pool, settings)
    return _verifiers(specs, team_id, pool, settings)


def score_trial(request: RewardTrialRequest, verifiers: dict[str, VerifierEndpoint]) -> RewardTrialRead:
    """Bind the (checked) rewards here and score the samples; a sandboxed reward needs this
    host's sandbox. :class:`InvalidSpec` for one that fails as it would fail a job."""
    specs = request.rewards or []
    columns = _columns(request)
    _refuse_without_sandbox(specs)
    try:
        context = RewardContext(timeout_seconds=request.reward_timeout_seconds, verifiers=verifiers)
        rewards = bind_rewards(specs, context, columns)
    except SpecError as exc:
        raise InvalidSpec([exc]) from None
    samples = [TrialSample(sample.prompt_value(), sample.completion, sample.columns)
               for sample in request.samples]
    try:
        scored = score_samples(rewards, samples)
    except RewardFailed as exc:
        index = reward_names(specs).index(exc.reward)
        raise InvalidSpec([SpecError(f"rewards.{index}", exc.message)]) from None
    return RewardTrialRead(items=[SampleScoresRead(reward=item.reward, rewards=item.rewards,
                                                   problems=item.problems) for item in scored])


def run_trial(request: RewardTrialRequest, team_id: int, settings: Settings) -> RewardTrialRead:
    """Each sample's scores, scored here; :class:`InvalidSpec` (a 422 naming the field) for a
    reward that does not validate, cannot run here, or fails as it would fail a job (a grader
    that does not load). A worker runs the whole of it again for a request the API relayed:
    what it reads from Redis is checked as if it came from a client."""
    return score_trial(request, check_trial(request, team_id, settings))
