"""A ``job:ID[@STEP]`` model source, the policy's or a reward's, resolved where the artifacts are:
the other job's final model or checkpoint folder (:func:`api.artifacts.paths.model_to_continue`,
a checkpoint only if an attempt published it: its row; with an object store apart from the
artifacts folder, fetched from it first), loaded like a ``path:`` source under the artifacts root.
The API checked at submit that the job is the same team's and had the model; retention may have
deleted a checkpoint since, which the job cannot help: ``source_unavailable``. Then ``file:``
sources (uploads) are made loadable (:mod:`worker.file_sources`).

The core loads every reward's model under one root. A job's reward models come from one place
(:func:`api.domain.spec_sources.mixed_reward_models`, which says why), so where they are other
jobs' models that root is the artifacts root, which holds every folder a ``job:`` source loads:
those this worker fetched from the store too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from api.artifacts.paths import model_to_continue, remote_store, stored_model_to_continue
from api.domain.job_spec import JobSpec, continued_job
from api.domain.spec_sources import mixed_reward_models
from api.settings import Settings
from grpo_core.errors import SourceUnavailable
from grpo_core.rewards.registry import model_sources
from grpo_core.spec.run_spec import RewardSpec
from worker.file_sources import SourceRoots, with_files, with_reward_model
from worker.job_storage import fetch_folder
from worker.staged_artifacts import published_of


def loadable(spec: JobSpec, settings: Settings) -> tuple[JobSpec, SourceRoots]:
    """``(spec to build from, the roots its path: sources load under)``: ``spec`` itself under
    the service's roots, or a copy whose ``job:`` sources are the folders they name (under the
    artifacts root) and whose ``file:`` sources are this host's copies of the uploads."""
    roots = SourceRoots(models=Path(settings.models_root), data=Path(settings.data_root),
                        reward_models=Path(settings.models_root))
    continued = continued_job(spec.model.source)
    if continued is not None:
        folder = _job_folder(settings, "model.source", spec.model.source, *continued)
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"source": f"path:{folder}"})})
        roots = replace(roots, models=Path(settings.artifacts_root))
    rewards = _rewards(spec, settings)
    if rewards is not None:
        spec = spec.model_copy(update={"rewards": rewards})
        roots = replace(roots, reward_models=Path(settings.artifacts_root))
    return with_files(spec, settings, roots)


def _rewards(spec: JobSpec, settings: Settings) -> list[RewardSpec] | None:
    """The rewards with the folders of the other jobs' models they name (wherever in its args a
    reward names one), None when none names one."""
    named = [(field, source, job) for field, source in model_sources(spec.rewards)
             if (job := continued_job(source)) is not None]
    if not named:
        return None
    mixed = mixed_reward_models(spec)
    if mixed is not None:
        raise mixed
    rewards = list(spec.rewards)
    for field, source, (job_id, step) in named:
        rewards = with_reward_model(rewards, field, _job_folder(settings, field, source, job_id, step))
    return rewards


def _job_folder(settings: Settings, field: str, source: str, job_id: int, step: int | None) -> Path:
    """The folder ``source`` (at ``field``) loads, fetched into this worker's artifacts folder
    first where the store is apart from it."""
    store = remote_store(settings)
    published = published_of(settings, job_id)  # a stale attempt's folder has no row
    if store is None:
        folder = model_to_continue(settings, job_id, step, published.checkpoints)
    else:  # another worker may have trained it: from the store, into this one's artifacts folder
        key = stored_model_to_continue(store, job_id, step, published)
        folder = fetch_folder(store, settings, key) if key is not None else None
    if folder is None:
        raise SourceUnavailable(field, f"{source} no longer exists (its job's retention may have "
                                       "removed that checkpoint)")
    return folder


def job_model_folder(settings: Settings, field: str, source: str) -> Path:
    """The folder a ``job:ID[@STEP]`` ``source`` (at ``field``) loads, as a training job's model
    source is resolved (a serving job's model: :mod:`worker.serving`); ValueError for another scheme."""
    named = continued_job(source)
    if named is None:
        raise ValueError(f"{field}: {source} is no job: source")
    return _job_folder(settings, field, source, *named)
