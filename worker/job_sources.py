"""A ``job:ID[@STEP]`` model source, resolved where the artifacts are: the other job's final
model or checkpoint folder (:func:`api.artifacts.paths.model_to_continue`, a checkpoint only if an
attempt published it: its row; with an object store apart from the artifacts folder, fetched from
it first), loaded like a
``path:`` source under the artifacts root. The API checked at submit that the job is the same
team's and had the model; retention may have deleted a checkpoint since, which the job cannot
help: ``source_unavailable``. Then ``file:`` sources (uploads) are made loadable
(:mod:`worker.file_sources`)."""

from __future__ import annotations

from pathlib import Path

from api.artifacts.paths import model_to_continue, remote_store, stored_model_to_continue
from api.domain.job_spec import JobSpec, continued_job
from api.settings import Settings
from grpo_core.errors import SourceUnavailable
from worker.file_sources import SourceRoots, with_files
from worker.job_storage import fetch_folder
from worker.staged_artifacts import published_of


def loadable(spec: JobSpec, settings: Settings) -> tuple[JobSpec, SourceRoots]:
    """``(spec to build from, the roots its path: sources load under)``: ``spec`` itself under
    the service's roots, or a copy whose ``job:`` source is the folder it names (under the
    artifacts root) and whose ``file:`` sources are this host's copies of the uploads."""
    roots = SourceRoots(models=Path(settings.models_root), data=Path(settings.data_root),
                        reward_models=Path(settings.models_root))
    continued = continued_job(spec.model.source)
    if continued is not None:
        spec = _continued(spec, settings, *continued)
        roots = SourceRoots(models=Path(settings.artifacts_root), data=roots.data,
                            reward_models=roots.reward_models)
    return with_files(spec, settings, roots)


def _continued(spec: JobSpec, settings: Settings, job_id: int, step: int | None) -> JobSpec:
    store = remote_store(settings)
    published = published_of(settings, job_id)  # a stale attempt's folder has no row
    if store is None:
        folder = model_to_continue(settings, job_id, step, published.checkpoints)
    else:  # another worker may have trained it: from the store, into this one's artifacts folder
        key = stored_model_to_continue(store, job_id, step, published)
        folder = fetch_folder(store, settings, key) if key is not None else None
    if folder is None:
        raise SourceUnavailable("model.source", f"{spec.model.source} no longer exists (its job's "
                                                "retention may have removed that checkpoint)")
    model = spec.model.model_copy(update={"source": f"path:{folder}"})
    return spec.model_copy(update={"model": model})
