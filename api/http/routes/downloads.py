"""Taking a trained model away: a job's final model, or any checkpoint it keeps, as a tar of a
Hugging Face folder (``from_pretrained`` loads it once unpacked), streamed from the artifacts
volume (:mod:`api.http.tar_stream`): team-scoped like every job route, exact ``Content-Length``,
``Range`` for a download that broke off. Each file is opened only while its bytes stream, and
pinned (:mod:`api.http.download_pins`) so that retention deleting it meanwhile breaks nothing.

With ``GRPO_STORAGE_URL`` apart from the artifacts folder (:func:`api.artifacts.paths.remote_store`),
the workers' artifacts are in the store, not on this host: the same archives are streamed from
its objects, a stored folder counting once its mark (stored last) is there."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection

from api.artifacts.paths import (
    COMPLETE_MARK,
    MODEL_MARK,
    checkpoint_key,
    complete_checkpoint,
    model_dir,
    remote_store,
    stored_model,
    stored_tracker_folder,
    tensorboard_dir,
)
from api.domain.errors import NotFound
from api.domain.job_spec import JobSpec
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.http.download_pins import PINS_DIR, DownloadPins
from api.http.error_responses import error_response
from api.http.params import JobId, StepNumber
from api.http.tar_stream import TarStream, parse_range
from api.storage import ObjectInfo, ObjectStore
from api.store import jobs as job_store
from api.store import telemetry
from grpo_core.io.model_export import (
    ADAPTER_CONFIG,
    GENERATION_CONFIG,
    generated_files,
    is_model_file,
    model_files,
)

router = APIRouter(prefix="/jobs/{job_id}", tags=["downloads"])
_TAR = {"content": {"application/x-tar": {}}, "description": "The folder as a tar (206: the range asked)"}
_RESPONSES = {200: _TAR, 206: _TAR, 404: {"description": "No such job, or nothing to download yet"},
              416: {"description": "The range is outside the archive"}}


async def get_download_pins(conn: HTTPConnection) -> DownloadPins:
    """The app's pinned downloads, made on first use (inline, so once, on the event loop)."""
    state = conn.app.state
    pins = getattr(state, "download_pins", None)
    if pins is None:
        pins = state.download_pins = DownloadPins(Path(state.settings.artifacts_root) / PINS_DIR)
    return pins


PinsDep = Annotated[DownloadPins, Depends(get_download_pins)]


@router.get("/model", response_class=StreamingResponse, responses=_RESPONSES)
def download_model(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
                   pins: PinsDep, range_: Annotated[str | None, Header(alias="Range")] = None) -> Response:
    """The job's final model, written when it finished (``model`` event): weights, tokenizer,
    generation config and a model card; with ``export.merge_lora`` the merged weights and the
    adapter under ``adapter/``."""
    job_store.get_job(session, job_id, principal.scope)
    name, store = f"job-{job_id}-model", remote_store(settings)
    if store is not None:  # the model of the attempt the job succeeded as, never a stale one's
        key = stored_model(store, job_id, telemetry.published_artifacts(session, job_id))
        stored = _stored_under(store, key) if key is not None else {}
        if MODEL_MARK not in stored:
            raise _no_model(job_id)
        return _tar_response(TarStream(name, {}, {}, store=store, stored=stored), f"{name}.tar", range_)
    folder = model_dir(settings, job_id)
    if not folder.is_dir():
        raise _no_model(job_id)
    archive = _archive(pins, name, _files_under(folder), {}, "job_id")
    return _tar_response(archive, f"{name}.tar", range_)


def _no_model(job_id: int) -> NotFound:
    return NotFound(f"job {job_id} has no final model: it is written when the job finishes its last "
                    "step (a checkpoint of it downloads from /checkpoints/{step}/archive)", param="job_id")


@router.get("/tensorboard", response_class=StreamingResponse, responses=_RESPONSES)
def download_tensorboard(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
                         pins: PinsDep, range_: Annotated[str | None, Header(alias="Range")] = None
                         ) -> Response:
    """The TensorBoard event files of a job with ``report_to: [tensorboard]`` (``tensorboard
    --logdir`` the unpacked folder), as written so far."""
    job = job_store.get_job(session, job_id, principal.scope)
    name, folder = f"job-{job_id}-tensorboard", tensorboard_dir(settings, job_id)
    store = remote_store(settings)
    key = stored_tracker_folder(store, job_id, folder.name, job.attempt) if store is not None else None
    stored = _stored_under(store, key) if key is not None else {}
    if not (stored or folder.is_dir()):
        raise NotFound(f"job {job_id} has no TensorBoard files: its spec does not report_to tensorboard, "
                       "or it has not trained a step yet", param="job_id")
    if store is not None:  # stored at the end of each attempt
        return _tar_response(TarStream(name, {}, {}, store=store, stored=stored), f"{name}.tar", range_)
    archive = _archive(pins, name, _files_under(folder), {}, "job_id")
    return _tar_response(archive, f"{name}.tar", range_)


def _stored_under(store: ObjectStore, prefix: str) -> dict[str, ObjectInfo]:
    base = prefix.rstrip("/") + "/"
    return {info.key.removeprefix(base): info for info in store.list(base)}


def _files_under(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


@router.get("/checkpoints/{step}/archive", response_class=StreamingResponse, responses=_RESPONSES)
def download_checkpoint(job_id: JobId, step: StepNumber,
                        session: SessionDep, principal: PrincipalDep, settings: SettingsDep, pins: PinsDep,
                        range_: Annotated[str | None, Header(alias="Range")] = None) -> Response:
    """A kept checkpoint as a model folder: its weights (or adapter) and tokenizer, with a
    generation config and a model card made for it; the training state (optimizer, RNG) stays."""
    job = job_store.get_job(session, job_id, principal.scope)
    # Only a checkpoint an attempt published while it owned the job (its row, docs/architecture.md
    # §6): a folder without one is a stale attempt's, and in a store, under the key its row names.
    checkpoints = telemetry.published_artifacts(session, job_id).checkpoints
    published = step in checkpoints
    store = remote_store(settings)
    stored = (_stored_under(store, checkpoint_key(job_id, step, checkpoints[step]))
              if store is not None and published else {})
    folder = complete_checkpoint(settings, job_id, step) if store is None and published else None
    if folder is None and COMPLETE_MARK not in stored:
        raise NotFound(f"job {job_id} keeps no checkpoint of step {step} (see its /checkpoints)",
                       param="step")
    records = telemetry.list_metrics(session, job_id, after_step=step - 1, limit=1)
    metrics = records[0].values if records and records[0].step == step else None
    made = (JobSpec.model_validate(job.spec), step, metrics, job_id)
    name = f"job-{job_id}-step-{step}"
    if store is not None:
        model = {n: info for n, info in stored.items() if "/" not in n and is_model_file(n)}
        archive = TarStream(name, {}, _stored_generated(store, stored, *made), store=store, stored=model)
        return _tar_response(archive, f"{name}.tar", range_)
    files = {p.name: p for p in model_files(folder)}
    return _tar_response(_archive(pins, name, files, generated_files(folder, *made), "step"), f"{name}.tar",
                         range_)


def _stored_generated(store: ObjectStore, stored: dict[str, ObjectInfo], *made: Any) -> dict[str, bytes]:
    """:func:`generated_files` of a stored checkpoint: the two small files it reads fetched first."""
    with tempfile.TemporaryDirectory() as folder:
        for name in (GENERATION_CONFIG, ADAPTER_CONFIG):
            if name in stored:
                store.get_file(stored[name].key, Path(folder, name))
        return generated_files(Path(folder), *made)


def _archive(pins: DownloadPins, name: str, files: dict[str, Path], generated: dict[str, bytes],
             param: str) -> TarStream:
    try:
        pinned = pins.pin(files)
        return TarStream(name, pinned.files, generated, on_close=pinned.release)
    except FileNotFoundError as exc:  # deleted (retention, a newer export) since it was listed
        raise NotFound(f"{name} was deleted while its download began; list what is kept and "
                       "ask again", param=param) from exc


def _tar_response(archive: TarStream, filename: str, range_header: str | None) -> Response:
    headers = {"Accept-Ranges": "bytes", "Content-Disposition": f'attachment; filename="{filename}"'}
    try:
        asked = parse_range(range_header, archive.length)
    except ValueError as exc:
        archive.close()
        response = error_response(416, "range_not_satisfiable", str(exc), param="Range")
        response.headers["Content-Range"] = f"bytes */{archive.length}"
        return response
    # Run once the response is over, the client gone or not: a download abandoned midway leaves
    # its iterator suspended, and it would release the archive's pins only when collected.
    done = BackgroundTask(archive.close)
    if asked is None:
        headers["Content-Length"] = str(archive.length)
        return StreamingResponse(archive.iter_range(), media_type="application/x-tar", headers=headers,
                                 background=done)
    start, end = asked
    headers["Content-Length"] = str(end - start + 1)
    headers["Content-Range"] = f"bytes {start}-{end}/{archive.length}"
    return StreamingResponse(archive.iter_range(start, end), status_code=206, media_type="application/x-tar",
                             headers=headers, background=done)

