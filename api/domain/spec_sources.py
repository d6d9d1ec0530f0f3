"""Where a job's spec says its files and models come from: every ``file:ID`` source (the model,
the datasets, and each model a reward names, wherever in its args the reward declares it: a
``reward_model``'s or a judge's ``model``, a cosine ``embedding_model``, a ``multi``'s
``graders.NAME.model``), and the rules that follow from them. A module apart from
:mod:`api.domain.job_spec` because it asks the rewards' registry which of their args name models
(torch-free, but more than the spec's own layer may import)."""

from __future__ import annotations

from typing import Any

from api.domain.job_spec import JobSpec, continued_job
from grpo_core.errors import SpecError
from grpo_core.rewards.registry import model_sources
from grpo_core.spec.run_spec import RewardSpec
from grpo_core.spec.sources import file_source_id

__all__ = ["file_sources", "mixed_reward_models", "refuse_job_source", "reward_model_sources"]


def refuse_job_source(spec: JobSpec) -> None:
    """``grpo train`` loads ``path:`` and ``hf:`` sources; another job's model and uploaded files
    exist only in the service. Raises :class:`SpecError`."""
    if continued_job(spec.model.source) is not None:
        raise SpecError("model.source", "'job:' sources name a job of the service; use 'path:' here")
    for field, _ in file_sources(spec.model_dump(mode="json")):
        raise SpecError(field, "'file:' sources name a file uploaded to the service; use 'path:' here")


def file_sources(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, file id)`` of every ``file:ID`` source of a spec given as JSON (a parsed one's
    dump or a stored one): the model, the datasets and every model a reward names (its
    ``args.model``, a cosine ``embedding_model``, a ``multi``'s judges). Sources that are not
    well-formed ``file:`` ones are left out (a stored spec was checked when stored)."""
    found = [(f"{name}.source", (spec.get(name) or {}).get("source"))
             for name in ("model", "dataset", "eval_dataset")]
    found += reward_model_sources(spec.get("rewards"))
    return [(field, source.partition(":")[2].strip()) for field, source in found
            if isinstance(source, str) and _is_file_source(source)]


def reward_model_sources(rewards: Any) -> list[tuple[str, str]]:
    """``(rewards.N.args.PATH, source)`` of every model the rewards (as JSON) name, wherever in
    their args each reward declares one; rewards whose args do not validate name none."""
    if not isinstance(rewards, list):
        return []
    found = []
    for index, reward in enumerate(rewards):
        try:
            parsed = RewardSpec.model_validate(reward)
        except ValueError:
            continue
        found += [(f"rewards.{index}.{field.partition('.')[2].partition('.')[2]}", source)
                  for field, source in model_sources([parsed])]
    return found


def _is_file_source(source: str) -> bool:
    try:
        return file_source_id(source) is not None
    except ValueError:
        return False


def mixed_reward_models(spec: JobSpec) -> SpecError | None:
    """The core loads every reward's model under one root: the models root, or, where one is an
    upload, the worker's cache of uploads. So a job's reward models are either ``path:`` ones or
    uploads (``hf:`` ones go with both): the error naming the first ``path:`` one of a spec that
    mixes them, else None."""
    models = model_sources(spec.rewards)
    if not any(_is_file_source(model) for _, model in models):
        return None
    for field, model in models:
        if model.partition(":")[0].strip() == "path":
            return SpecError(field, "one job's reward models come either from the "
                             "models root ('path:') or from the team's uploads ('file:'), not both")
    return None
