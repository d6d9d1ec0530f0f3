"""A submitted model source's ``config.json``, read as JSON where the service holds the model:
a ``path:`` folder under the models root, a ``job:`` source's checkpoint or final model (in the
artifacts folder or the store), a ``file:`` upload's archive. Never the model itself: the web
process imports no torch or transformers.

An upload is a tar(.gz) in the store; only its first :data:`ARCHIVE_HEAD_BYTES` are read (a
``tar`` of a sorted listing puts ``config.json`` before the weights). Whatever cannot be read here
(an ``hf:`` model, a config past that head, a store that does not answer) gives None: the core
checks the loaded model's config before the first step anyway (:mod:`grpo_core.run.components`).
"""

from __future__ import annotations

import io
import json
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy.orm import Session

from api.artifacts.paths import model_to_continue, object_store, remote_store, stored_model_to_continue
from api.domain.job_spec import JOB_SCHEME, continued_job, split_any_source
from api.settings import Settings
from api.storage import StorageError
from api.storage.keys import file_key
from api.store.telemetry import published_artifacts
from api.uploads.model_archives import MAX_CONFIG_BYTES
from grpo_core.errors import SpecError
from grpo_core.io.paths import resolve_under_root
from grpo_core.spec.sources import FILE_SCHEME

CONFIG = "config.json"
ARCHIVE_HEAD_BYTES = 16 * 1024 * 1024


def model_config(source: str, settings: Settings, session: Session) -> dict[str, Any] | None:
    """The model's config as a dict, or None where it cannot be read here (see the module's note).
    ``source`` was checked already (:mod:`api.http.submission`): it is well formed and the team's."""
    try:
        scheme, location = split_any_source(source)
        if scheme == "path":
            folder = resolve_under_root(location, Path(settings.models_root), None, "model.source")
            return _parsed((folder / CONFIG).read_bytes())
        if scheme == JOB_SCHEME:
            return _job_config(source, settings, session)
        if scheme == FILE_SCHEME:
            return _archive_config(location, settings)
    except (OSError, ValueError, StorageError, SpecError, tarfile.TarError, EOFError, zlib.error):
        return None
    return None


def _parsed(raw: bytes) -> dict[str, Any] | None:
    """A config of at most MAX_CONFIG_BYTES (as uploads are bounded) holding a JSON object."""
    config = json.loads(raw) if len(raw) <= MAX_CONFIG_BYTES else None
    return config if isinstance(config, dict) else None


def _job_config(source: str, settings: Settings, session: Session) -> dict[str, Any] | None:
    """The config of the folder a ``job:`` source loads (its checkpoints and final model are
    written by ``save_pretrained``, config.json included; a LoRA checkpoint holds none)."""
    job_id, step = continued_job(source)  # type: ignore[misc]  # a job: source, as checked
    store = remote_store(settings)
    published = published_artifacts(session, job_id)
    if store is None:
        folder = model_to_continue(settings, job_id, step, published.checkpoints)
        return None if folder is None else _parsed((folder / CONFIG).read_bytes())
    key = stored_model_to_continue(store, job_id, step, published)
    if key is None:
        return None
    with store.open_read(f"{key}/{CONFIG}", 0, MAX_CONFIG_BYTES + 1) as stream:
        return _parsed(b"".join(stream))


def _archive_config(file_id: str, settings: Settings) -> dict[str, Any] | None:
    """config.json at an upload's top (its root or its one top-level folder), from the archive's head."""
    with object_store(settings).open_read(file_key(file_id), 0, ARCHIVE_HEAD_BYTES) as stream:
        head = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(head), mode="r|*") as archive:
        for member in archive:  # a head cut inside the archive ends here with a ReadError
            parts = [part for part in PurePosixPath(member.name).parts if part != "."]
            if member.isfile() and parts[-1:] == [CONFIG] and len(parts) <= 2:
                handle = archive.extractfile(member)
                return None if handle is None else _parsed(handle.read(MAX_CONFIG_BYTES + 1))
    return None
