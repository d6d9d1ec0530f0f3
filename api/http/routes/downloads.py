"""Taking a trained model away: a job's final model, or any checkpoint it keeps, as a tar of a
Hugging Face folder (``from_pretrained`` loads it once unpacked), streamed from the artifacts
volume (:mod:`api.http.tar_stream`): team-scoped like every job route, exact ``Content-Length``,
``Range`` for a download that broke off. Each file is opened only while its bytes stream, and
pinned (:mod:`api.http.download_pins`) so that retention deleting it meanwhile breaks nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection

from api.artifact_paths import complete_checkpoint, model_dir, tensorboard_dir
from api.domain_errors import NotFound
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.http.download_pins import PINS_DIR, DownloadPins
from api.http.error_responses import error_response
from api.http.params import MAX_INT, JobId
from api.http.tar_stream import TarStream, parse_range
from api.job_spec import JobSpec
from api.store import jobs as job_store
from api.store import telemetry
from grpo_core.io.model_export import generated_files, model_files

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
    folder = model_dir(settings, job_id)
    if not folder.is_dir():
        raise NotFound(f"job {job_id} has no final model: it is written when the job finishes its last "
                       "step (a checkpoint of it downloads from /checkpoints/{step}/archive)", param="job_id")
    archive = _archive(pins, f"job-{job_id}-model", _files_under(folder), {}, "job_id")
    return _tar_response(archive, f"job-{job_id}-model.tar", range_)


@router.get("/tensorboard", response_class=StreamingResponse, responses=_RESPONSES)
def download_tensorboard(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
                         pins: PinsDep, range_: Annotated[str | None, Header(alias="Range")] = None
                         ) -> Response:
    """The TensorBoard event files of a job with ``report_to: [tensorboard]`` (``tensorboard
    --logdir`` the unpacked folder), as written so far."""
    job_store.get_job(session, job_id, principal.scope)
    folder = tensorboard_dir(settings, job_id)
    if not folder.is_dir():
        raise NotFound(f"job {job_id} has no TensorBoard files: its spec does not report_to tensorboard, "
                       "or it has not trained a step yet", param="job_id")
    archive = _archive(pins, f"job-{job_id}-tensorboard", _files_under(folder), {}, "job_id")
    return _tar_response(archive, f"job-{job_id}-tensorboard.tar", range_)


def _files_under(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


@router.get("/checkpoints/{step}/archive", response_class=StreamingResponse, responses=_RESPONSES)
def download_checkpoint(job_id: JobId, step: Annotated[int, PathParam(ge=1, le=MAX_INT)],
                        session: SessionDep, principal: PrincipalDep, settings: SettingsDep, pins: PinsDep,
                        range_: Annotated[str | None, Header(alias="Range")] = None) -> Response:
    """A kept checkpoint as a model folder: its weights (or adapter) and tokenizer, with a
    generation config and a model card made for it; the training state (optimizer, RNG) stays."""
    job = job_store.get_job(session, job_id, principal.scope)
    folder = complete_checkpoint(settings, job_id, step)
    if folder is None:
        raise NotFound(f"job {job_id} keeps no checkpoint of step {step} (see its /checkpoints)",
                       param="step")
    records = telemetry.list_metrics(session, job_id, after_step=step - 1, limit=1)
    metrics = records[0].values if records and records[0].step == step else None
    spec = JobSpec.model_validate(job.spec)
    files = {p.name: p for p in model_files(folder)}
    generated = generated_files(folder, spec, step, metrics, job_id)
    name = f"job-{job_id}-step-{step}"
    return _tar_response(_archive(pins, name, files, generated, "step"), f"{name}.tar", range_)


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

