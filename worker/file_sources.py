"""``file:ID`` sources (a team's uploads, ``POST /v1/files``) made loadable on this worker host.
Each file comes through :class:`worker.file_cache.FileCache` (downloaded once per host and
content hash) and its source is rewritten to a ``path:`` that the core loads under a root, as it
loads any other:

- a model (``model.source``, a reward's ``model`` argument): the archive's unpacked Hugging Face
  folder (the archive's root or its one top folder, :func:`model_folder_prefix`), under the
  cache's root, which becomes that model's root;
- a dataset: the core picks a file's reader by its name's suffix and confines every dataset of a
  spec to one data root. So the datasets get a folder of this process's own
  (:meth:`FileCache.links`) where each is a hard link named for its field and the format its files
  row records: no copy, and no symlink for the core's containment check to refuse. A ``path:``
  dataset of the same spec (an operator's shared eval set) is checked under the data root as the
  core checks it, then linked there too (copied when the data root is on another filesystem).

The files row is read here (its format); the API checked at submit that the file is the job's
team's and ready, and refuses to delete it while the job has not finished.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from api.artifacts.paths import object_store
from api.domain.errors import NotFound
from api.domain.job_spec import JobSpec
from api.domain.spec_sources import file_sources, mixed_reward_models
from api.settings import Settings
from api.storage import ChecksumMismatch, ObjectNotFound
from api.store.db import session_scope
from api.store.files import get_file
from api.uploads.model_archives import model_folder_prefix
from grpo_core.errors import SourceUnavailable
from grpo_core.io.paths import resolve_under_root
from grpo_core.rewards.registry import model_sources
from grpo_core.spec.run_spec import RewardSpec
from grpo_core.spec.sources import file_source_id, split_source
from worker.file_cache import FileCache, UnsafeArchive
from worker.retrying import retry_transient

PATH = "path:"


@dataclass(frozen=True)
class SourceRoots:
    """Where the core resolves each kind of ``path:`` source of one job."""

    models: Path
    data: Path
    reward_models: Path


def with_files(spec: JobSpec, settings: Settings, roots: SourceRoots) -> tuple[JobSpec, SourceRoots]:
    """``spec`` with its ``file:`` sources rewritten to ``path:`` ones under the roots returned
    (``roots`` where a kind has none)."""
    if not file_sources(spec.model_dump(mode="json")):
        return spec, roots
    cache = FileCache.of(settings, object_store(settings))
    cache_root = Path(cache.root).resolve()
    update: dict[str, Any] = {}
    model_id = file_source_id(spec.model.source)
    if model_id is not None:
        folder = _model_folder(cache, model_id, "model.source")
        update["model"] = spec.model.model_copy(update={"source": f"{PATH}{folder}"})
        roots = replace(roots, models=cache_root)
    rewards = _rewards(spec, cache)
    if rewards is not None:
        update["rewards"] = rewards
        roots = replace(roots, reward_models=cache_root)
    datasets = _datasets(spec, settings, cache)
    if datasets is not None:
        links, copies = datasets
        update.update(copies)
        roots = replace(roots, data=links)
    return spec.model_copy(update=update), roots


def _fetched(field: str, fetch: Callable[[], Path]) -> Path:
    """``fetch()``; a file gone from the store, or not what was uploaded, is not the team's fault."""
    try:
        return fetch()
    except ObjectNotFound as exc:
        raise SourceUnavailable(field, f"the uploaded file is missing from the object store ({exc})") from exc
    except (ChecksumMismatch, UnsafeArchive) as exc:
        raise SourceUnavailable(field, f"the uploaded file could not be used: {exc}") from exc


def _model_folder(cache: FileCache, file_id: str, field: str) -> Path:
    unpacked = _fetched(field, lambda: cache.model(file_id))
    names = [p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*") if p.is_file()]
    return (unpacked / model_folder_prefix(names)).resolve()


def _rewards(spec: JobSpec, cache: FileCache) -> list[RewardSpec] | None:
    """The rewards with their uploaded models' folders (wherever in its args a reward names one:
    ``model``, ``embedding_model``, a ``multi``'s ``graders.NAME.model``), None when none names
    one. The core has one root for every reward's model, so a spec cannot mix an uploaded one with
    a ``path:`` or ``job:`` one (:func:`mixed_reward_models`, refused at submit too)."""
    uploaded = [(field, file_id) for field, source in model_sources(spec.rewards)
                if (file_id := file_source_id(source)) is not None]
    if not uploaded:
        return None
    mixed = mixed_reward_models(spec)
    if mixed is not None:
        raise mixed
    rewards = list(spec.rewards)
    for field, file_id in uploaded:
        rewards = with_reward_model(rewards, field, _model_folder(cache, file_id, field))
    return rewards


def with_reward_model(rewards: list[RewardSpec], field: str, folder: Path) -> list[RewardSpec]:
    """``rewards`` with the model at ``field`` (``rewards.N.args.PATH``, as
    :func:`~grpo_core.rewards.registry.model_sources` names it) the ``path:`` of ``folder``."""
    index, _, path = field.removeprefix("rewards.").partition(".args.")
    rewards = list(rewards)
    reward = rewards[int(index)]
    rewards[int(index)] = reward.model_copy(
        update={"args": _with_value(reward.args, path.split("."), f"{PATH}{folder}")})
    return rewards


def _with_value(args: dict[str, Any], keys: list[str], value: str) -> dict[str, Any]:
    """``args`` with the value at ``keys`` (a path of nested mappings) replaced; the rest shared."""
    head, *rest = keys
    return {**args, head: _with_value(args[head], rest, value) if rest else value}


def _datasets(spec: JobSpec, settings: Settings, cache: FileCache) -> tuple[Path, dict[str, Any]] | None:
    """``(data root, the datasets to replace)`` when a dataset the job loads is uploaded: the
    eval_dataset only when the job evaluates, as the core loads it. Inline rows and ``hf:``
    datasets need no root and stay as they are."""
    fields = {"dataset": spec.dataset}
    if spec.eval_dataset is not None and spec.grpo.eval_strategy != "no":
        fields["eval_dataset"] = spec.eval_dataset
    sources = {field: d.source for field, d in fields.items() if d.source is not None}
    if not any(file_source_id(source) is not None for source in sources.values()):
        return None
    links = cache.links()
    copies = {}
    for field, source in sources.items():
        file_id = file_source_id(source)
        if file_id is not None:
            name = f"{field}.{_dataset_format(settings, file_id, field)}"
            target = _fetched(f"{field}.source", lambda file_id=file_id: cache.dataset(file_id))
        else:
            scheme, location = split_source(source)
            if scheme != "path":
                continue
            name = f"{field}{Path(location).suffix.lower()}"  # the core reads a file by its suffix
            target = _operator_dataset(settings, location, f"{field}.source")
        _link(target, links / name)
        copies[field] = fields[field].model_copy(update={"source": f"{PATH}{name}"})
    return links, copies


def _operator_dataset(settings: Settings, location: str, field: str) -> Path:
    """A ``path:`` dataset, held to the data root exactly as the core would hold it."""
    path = resolve_under_root(location, Path(settings.data_root), None, field=field)
    if not path.is_file():
        raise SourceUnavailable(field, f"no such file: '{location}'")
    return path


def _dataset_format(settings: Settings, file_id: str, field: str) -> str:
    def read() -> str:
        with session_scope(settings.database_url) as session:
            return get_file(session, file_id, None).format

    try:
        return retry_transient(read, settings.db_retry_seconds, "reading an uploaded file's row")
    except NotFound as exc:
        raise SourceUnavailable(f"{field}.source", f"the uploaded file '{file_id}' no longer exists") from exc


def _link(target: Path, link: Path) -> None:
    link.unlink(missing_ok=True)  # a second resolution in this process (a LoRA merge's export)
    try:
        os.link(target, link)
    except OSError:  # another filesystem (only an operator's data root can be)
        shutil.copyfile(target, link)


def release_files(settings: Settings) -> None:
    """This process's job has ended: its cache entries may be evicted, its links go."""
    FileCache.of(settings, object_store(settings)).release()
