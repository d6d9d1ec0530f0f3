"""Where a job's spec says its files and models come from: every ``file:ID`` source (the model,
the datasets, and each model a reward names, wherever in its args the reward declares it: a
``reward_model``'s or a judge's ``model``, a cosine ``embedding_model``, a ``multi``'s
``graders.NAME.model``), every ``job:ID[@STEP]`` one (the model, a reward's model), and the rules
that follow from them. A module apart from :mod:`api.domain.job_spec` because it asks the rewards'
registry which of their args name models (torch-free, but more than the spec's own layer may
import)."""

from __future__ import annotations

from typing import Any

from api.domain.job_spec import JobSpec, continued_job
from grpo_core.errors import SpecError
from grpo_core.rewards.registry import model_sources
from grpo_core.spec.run_spec import RewardSpec
from grpo_core.spec.sources import file_source_id

__all__ = ["file_sources", "job_sources", "mixed_reward_models", "refuse_job_source", "reward_model_sources"]


def refuse_job_source(spec: JobSpec) -> None:
    """``grpo train`` loads ``path:`` and ``hf:`` sources; another job's model (the policy's or a
    reward's) and uploaded files exist only in the service. Raises :class:`SpecError`."""
    dumped = spec.model_dump(mode="json")
    for field, _, _ in job_sources(dumped):
        raise SpecError(field, "'job:' sources name a job of the service; use 'path:' here")
    for field, _ in file_sources(dumped):
        raise SpecError(field, "'file:' sources name a file uploaded to the service; use 'path:' here")


def job_sources(spec: dict[str, Any]) -> list[tuple[str, int, int | None]]:
    """``(field, job id, step or None)`` of every ``job:ID[@STEP]`` source of a spec given as JSON
    (a parsed one's dump or a stored one): ``model.source`` and every model a reward names.
    Malformed ones are left out (a stored spec was checked when stored)."""
    found = [("model.source", (spec.get("model") or {}).get("source")),
             *reward_model_sources(spec.get("rewards"))]
    named = []
    for field, source in found:
        try:
            job = continued_job(source) if isinstance(source, str) else None
        except ValueError:
            continue
        if job is not None:
            named.append((field, *job))
    return named


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


# Where the worker finds a reward's model, by its source's scheme: each is a root of its own (the
# models root; the cache of uploads; the artifacts root, where another job's folders are, fetched
# from the store or not). The core's one root for every reward model is kept, and a job's reward
# models come from one of these places, rather than giving the core a root per field (threaded
# through every reward's build and a multi's graders', for origins the core knows nothing of) or
# making every place reachable under one root (a folder cannot be hard-linked, the core's
# containment check refuses a symlink out of its root, and a copy is a model's gigabytes per job).
_REWARD_MODEL_ORIGINS = {"path": "the models root ('path:')", "file": "the team's uploads ('file:')",
                         "job": "the team's other jobs ('job:')"}


def mixed_reward_models(spec: JobSpec) -> SpecError | None:
    """The core loads every reward's model under one root (``RewardContext.models_root``):
    the models root, the worker's cache of uploads where one is an upload, or the artifacts root
    where one is another job's model (:mod:`worker.job_sources`). So a job's reward models come
    from one of those places (``hf:`` ones go with any): the error naming the first one from
    another place than the first, else None."""
    first: tuple[str, str] | None = None
    for field, model in model_sources(spec.rewards):
        scheme = model.partition(":")[0].strip()
        if scheme not in _REWARD_MODEL_ORIGINS:
            continue
        if first is None:
            first = field, scheme
        elif scheme != first[1]:
            return SpecError(field, (
                "one job's reward models all come from one place, the models root ('path:'), the "
                "team's uploads ('file:') or its other jobs ('job:'); hf: ones go with any. This one "
                f"comes from {_REWARD_MODEL_ORIGINS[scheme]}, {first[0]} from "
                f"{_REWARD_MODEL_ORIGINS[first[1]]}: not both"))
    return None
