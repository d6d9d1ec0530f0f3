"""Wire schemas of a team's uploaded files (``/v1/files``): datasets and model archives."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from api.schemas.jobs import UtcDatetime

FilePurpose = Literal["dataset", "model"]
FileStatus = Literal["uploading", "ready", "error"]


class FileRead(BaseModel):
    id: str = Field(description="`file-` and 24 hex digits; a spec names it as `file:ID`")
    purpose: FilePurpose = Field(description="`dataset`: prompt rows; `model`: a Hugging Face folder, "
                                             "as a tar")
    filename: str = Field(description="The uploaded file's name")
    format: str = Field(description="jsonl, json, csv or parquet (a dataset); tar (a model, gzipped or not)")
    bytes: int = Field(description="Its size as uploaded")
    unpacked_bytes: int | None = Field(None, description="A model archive's files unpacked, which is what "
                                       "the team's artifact quota counts (null: a dataset, counted as "
                                       "uploaded)")
    sha256: str = Field(description="SHA-256 of its bytes, hex")
    columns: list[str] | None = Field(None, description="A dataset's columns: every one some row has, in the "
                                      "order first seen; a spec naming the file is checked against them at "
                                      "submit (null: a model, or more columns than are recorded)")
    prompt_field: str | None = Field(None, description="The column a dataset's rows were checked to hold as "
                                     "their prompt (the upload's `prompt_field`, default `prompt`): a spec "
                                     "naming the file without its own `dataset.prompt_field` uses it")
    rows: int | None = Field(None, description="A dataset's row count (null: a model); a spec drawing more "
                             "prompts a round than this is warned of at submit")
    status: FileStatus = Field(description="`ready`: usable by jobs; `uploading`: being stored; `error`: "
                                           "could not be stored (delete it and upload again)")
    created_at: UtcDatetime
    # Not on our wire (``exclude``): the OpenAI purpose an upload named (``fine-tune``), which
    # makes its answers OpenAI's file object (api.openai_compat.file_object); None for ours.
    openai_purpose: str | None = Field(None, exclude=True)


class FilePage(BaseModel):
    """A page of files, newest first; pass ``next_after`` as ``after`` for the next (None: no more)."""

    items: list[FileRead]
    next_after: str | None
