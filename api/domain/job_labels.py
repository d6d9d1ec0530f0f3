"""A job's labels for finding it again: its ``tags`` and ``description``, as a spec gives them at
submit and ``PATCH /v1/jobs/{id}`` changes them. One definition, so the spec, the update and the
list filter (``GET /v1/jobs?tag=``) accept exactly the same tags. Pure: pydantic types only.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

MAX_TAGS = 16
MAX_TAG_LENGTH = 64
# Letters, digits and - _ . : / (``team:nlp``, ``exp/v2``): safe in a URL query, a shell and a
# terminal, and no LIKE wildcard, quote or space that a filter would have to escape.
TAG_PATTERN = r"^[A-Za-z0-9_.:/\-]{1,64}$"
MAX_DESCRIPTION_CHARS = 2_000
MAX_SEARCH_CHARS = 200  # a list's ``q``: longer than any name (128) or useful piece of a description
# Control characters (C0, DEL, C1) would garble a terminal or a table; a newline is a paragraph.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def unset(value: object) -> bool:
    """No tags, no description: left out of a dumped spec, so that a spec without them dumps (and
    hashes, for idempotency keys) as it did before they existed."""
    return value is None or value == []


def _distinct(tags: list[str]) -> list[str]:
    # A tag given twice is one tag; the first place it was given is kept.
    return list(dict.fromkeys(tags))


def _printable(text: str | None) -> str | None:
    if text is not None and _CONTROL.search(text):
        raise ValueError("no control characters but newlines")
    return text


Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN, max_length=MAX_TAG_LENGTH)]
Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS), AfterValidator(_distinct)]
Description = Annotated[str | None, Field(max_length=MAX_DESCRIPTION_CHARS), AfterValidator(_printable)]

TAGS_DESCRIPTION = (f"Short labels to find the job by (GET /v1/jobs?tag=, `grpo list --tag`): at most "
                    f"{MAX_TAGS}, each 1-{MAX_TAG_LENGTH} letters, digits or - _ . : /; a repeated tag "
                    "counts once, the order is kept")
DESCRIPTION_DESCRIPTION = (f"What the job is for, in words (at most {MAX_DESCRIPTION_CHARS} characters, "
                           "newlines allowed); GET /v1/jobs?q= searches it with the name")
