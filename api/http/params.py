"""Path and query parameters bounded to the columns they are compared with, so a value no
column can hold is a 422 naming the parameter before any query runs (Postgres would otherwise
refuse it mid-query: a 500). Ids and event cursors are BIGINT, steps are INTEGER. An id or a
cursor is written in ASCII digits only (a step may lead with ``-``): Python's ``int`` reads
``٤`` as 4 and pydantic's reads ``+4``, ``4_0`` and ``4.0``, none of which names an id."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator

from api.vocabulary import BEFORE_FIRST_STEP, NAME_PATTERN

MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1
MAX_NAME_LENGTH = 64  # team and pool names; the pattern also refuses NUL and other controls



def ascii_digits(text: str, signed: bool = False) -> bool:
    """``text`` is a whole number in ASCII digits (``-`` first allowed when ``signed``)."""
    digits = text[1:] if signed and text.startswith("-") else text
    return digits.isascii() and digits.isdigit()


def _digits_only(value: Any) -> Any:
    if isinstance(value, str) and not ascii_digits(value):
        raise ValueError("must be a whole number in ASCII digits (0-9)")
    return value


def _signed_digits_only(value: Any) -> Any:
    if isinstance(value, str) and not ascii_digits(value, signed=True):
        raise ValueError("must be a whole number in ASCII digits (0-9), '-' first if negative")
    return value


Digits = BeforeValidator(_digits_only)
SignedDigits = BeforeValidator(_signed_digits_only)
JobId = Annotated[int, Digits, Path(ge=1, le=MAX_BIGINT, description="A job's id")]
KeyId = Annotated[int, Digits, Path(ge=1, le=MAX_BIGINT, description="An API key's id")]
WebhookId = Annotated[int, Digits, Path(ge=1, le=MAX_BIGINT, description="A webhook's id")]
StepNumber = Annotated[int, Digits, Path(ge=1, le=MAX_INT, description="A checkpoint's step")]
FileId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^file-[0-9a-f]{24}$",
                             description="An uploaded file's id")]
TeamName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
PoolName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
VerifierName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]


def id_cursor(description: str) -> Any:
    """``after``-style cursor over a BIGINT id (0: from the start); ``Annotated[int, *id_cursor(...)]``."""
    return Digits, Query(ge=0, le=MAX_BIGINT, description=description)


def step_cursor(description: str, ge: int = BEFORE_FIRST_STEP) -> Any:
    """A step number (an INTEGER column); by default a cursor, which may stand before step 0;
    ``Annotated[int, *step_cursor(...)]``."""
    return SignedDigits, Query(ge=ge, le=MAX_INT, description=description)
MAX_METRIC_NAMES = 100  # `names=` repeats: far more than the metrics a record has
