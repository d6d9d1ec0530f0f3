"""``/v1/files``: a team's uploads, datasets and model archives that its jobs name as
``file:ID``. Team-scoped: another team's file is a 404, as if it did not exist; admins see
every team's. An upload streams to local disk, is checked, then stored
(:mod:`api.http.file_uploads`); content streams back from the object store."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.domain.errors import Conflict
from api.http.deps import ObjectStoreDep, PrincipalDep, SessionDep, SettingsDep
from api.http.file_uploads import accept_upload, refuse_hopeless, remove_object, storage_errors
from api.http.params import FileId
from api.http.upload_admission import UploadsInFlight
from api.http.upload_body import declared_bytes, receive_upload
from api.openai_compat.file_object import deleted_answer, file_answer
from api.schemas.files import FilePage, FileRead
from api.schemas.fine_tuning import OpenAIFile, OpenAIFileDeleted
from api.storage.interface import ObjectStream
from api.storage.keys import file_key
from api.store import files
from api.store.upload_slots import UploadSlots

router = APIRouter(prefix="/files", tags=["files"])
_404 = {404: {"description": "No such file (or another team's)"}}
_UPLOAD_BODY = {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "A dataset (.jsonl, .json array, .csv, .parquet) or a model (a tar or tar.gz "
                                "of a Hugging Face folder: config.json, *.safetensors, tokenizer files)"},
        "purpose": {"type": "string", "enum": ["dataset", "model", "fine-tune"],
                    "description": "Also OpenAI's `fine-tune` (what its client sends): a dataset whose rows "
                                   "hold their prompt as `messages`, answered as OpenAI's file object"},
        "prompt_field": {"type": "string", "description": "A dataset's prompt column (default: prompt)"}}}}}}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=FileRead | OpenAIFile,
             openapi_extra={"requestBody": _UPLOAD_BODY},
             responses={413: {"description": "Over the purpose's size limit (`request_too_large`), or "
                                             "over the room left in the team's artifact quota "
                                             "(`artifact_quota_exceeded`, naming the bytes in use)"},
                        422: {"description": "A bad field or content; `param` names it, the message the "
                                             "first bad row or archive member"},
                        408: {"description": "The body arrived slower than "
                                             "`GRPO_UPLOAD_MIN_BYTES_PER_SECOND` (`upload_too_slow`); "
                                             "nothing was kept"},
                        429: {"description": "The team already has `GRPO_MAX_UPLOADS_PER_TEAM` uploads in "
                                             "progress (`rate_limited`, with Retry-After)"},
                        503: {"description": "The object store failed (`unavailable`; the file is left as "
                                             "`error`), the API process already receives "
                                             "`GRPO_MAX_UPLOADS_IN_FLIGHT` uploads (`unavailable`), or the "
                                             "API host's disk for uploads in flight is full (`spool_full`); "
                                             "all with Retry-After"}})
async def upload_file(request: Request, principal: PrincipalDep, settings: SettingsDep,
                      store: ObjectStoreDep) -> FileRead | OpenAIFile:
    """Upload a dataset or a model; a job names it as ``file:ID`` (``model.source``,
    ``dataset.source``, ``eval_dataset.source``, a ``reward_model``'s ``model``). An OpenAI
    client's ``purpose=fine-tune`` upload is a dataset answered as OpenAI's file object."""
    # The places and the quota's first look come before the body is read: the spool disk is shared.
    with _uploads_in_flight(request).held():
        async with _upload_slots(request).held(principal.team_id, settings.max_uploads_per_team):
            check_size = await run_in_threadpool(refuse_hopeless, principal.team_id, settings,
                                                 declared_bytes(request))
            upload = await receive_upload(request, settings, check_size)
            try:
                accepted = await run_in_threadpool(accept_upload, upload, principal.team_id, settings, store)
                return file_answer(accepted)
            finally:
                await run_in_threadpool(upload.discard)


def _uploads_in_flight(request: Request) -> UploadsInFlight:
    """The process's places for uploads (``app.state``), made on first use."""
    state = request.app.state
    places = getattr(state, "uploads_in_flight", None)
    if places is None:
        places = state.uploads_in_flight = UploadsInFlight(state.settings.max_uploads_in_flight)
    return places


def _upload_slots(request: Request) -> UploadSlots:
    """The process's slots (``app.state``), made on first use."""
    state = request.app.state
    slots = getattr(state, "upload_slots", None)
    if slots is None:
        slots = state.upload_slots = UploadSlots(state.redis, state.settings.redis_keys)
    return slots


@router.get("", response_model=FilePage)
def list_files(session: SessionDep, principal: PrincipalDep,
               after: Annotated[str | None, Query(max_length=32, description="`next_after` of the previous "
                                                                             "page")] = None,
               limit: Annotated[int, Query(ge=1, le=200)] = 50) -> FilePage:
    """The team's files, newest first."""
    items = files.list_files(session, principal.scope, after, limit)
    return FilePage(items=items, next_after=items[-1].id if len(items) == limit else None)


@router.get("/{file_id}", response_model=FileRead | OpenAIFile, responses=_404)
def get_file(file_id: FileId, session: SessionDep, principal: PrincipalDep) -> FileRead | OpenAIFile:
    """The file; a ``purpose=fine-tune`` upload as OpenAI's file object."""
    return file_answer(files.get_file(session, file_id, principal.scope))


def _chunks(stream: ObjectStream):
    try:
        yield from stream
    finally:  # also when the client went away mid-download
        stream.close()


@router.get("/{file_id}/content", response_class=StreamingResponse,
            responses={**_404, 200: {"content": {"application/octet-stream": {}},
                                     "description": "The bytes as uploaded"},
                       409: {"description": "Not ready (still uploading, or failed to store)"}})
def file_content(file_id: FileId, session: SessionDep, principal: PrincipalDep,
                 store: ObjectStoreDep) -> Response:
    """The file's bytes as uploaded, streamed from the object store."""
    found = files.get_file(session, file_id, principal.scope)
    if found.status != "ready":
        raise Conflict(f"file '{file_id}' is {found.status}, not ready", param="file_id")
    with storage_errors(file_id):
        stream = store.open_read(file_key(file_id))
    headers = {"Content-Length": str(stream.length), "ETag": f'"{found.sha256}"',
               "Content-Disposition": f"attachment; filename*=UTF-8''{quote(found.filename)}"}
    return StreamingResponse(_chunks(stream), media_type="application/octet-stream", headers=headers)


@router.delete("/{file_id}", response_model=FileRead | OpenAIFileDeleted,
               responses={**_404, 409: {"description": "A job not yet finished uses it (named)"}})
def delete_file(file_id: FileId, session: SessionDep, principal: PrincipalDep,
                store: ObjectStoreDep) -> FileRead | OpenAIFileDeleted:
    """Remove the file, unless a job that has not finished names it in its spec; the answer is
    the file as it was (a ``purpose=fine-tune`` upload: OpenAI's ``{id, object, deleted}``)."""
    removed = files.delete_file(session, file_id, principal.scope)
    session.commit()  # the row first: an object without a row is unreachable, a row without one is not
    remove_object(store, file_id)
    return deleted_answer(removed)
