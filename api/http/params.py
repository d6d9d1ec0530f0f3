"""Path and query parameters bounded to the columns they are compared with, so a value no
column can hold is a 422 naming the parameter before any query runs (Postgres would otherwise
refuse it mid-query: a 500). Ids and event cursors are BIGINT, steps are INTEGER."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query

from api.vocabulary import BEFORE_FIRST_STEP, NAME_PATTERN

MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1
MAX_NAME_LENGTH = 64  # team and pool names; the pattern also refuses NUL and other controls

JobId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="A job's id")]
KeyId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="An API key's id")]
WebhookId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="A webhook's id")]
FileId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^file-[0-9a-f]{24}$",
                             description="An uploaded file's id")]
TeamName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
PoolName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
VerifierName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]


def id_cursor(description: str) -> Any:
    """``after``-style cursor over a BIGINT id (0: from the start)."""
    return Query(ge=0, le=MAX_BIGINT, description=description)


def step_cursor(description: str, ge: int = BEFORE_FIRST_STEP) -> Any:
    """A step number (an INTEGER column); by default a cursor, which may stand before step 0."""
    return Query(ge=ge, le=MAX_INT, description=description)
MAX_METRIC_NAMES = 100  # `names=` repeats: far more than the metrics a record has
