"""OpenAI's ids for this service's rows: a job ``ftjob-7`` (job 7 of ``/v1/jobs``), an event
``ftevent-12``, a checkpoint ``ftckpt-7-40`` (job 7's checkpoint of step 40). Only these forms are
read; anything else names nothing (a 404 for a path, a 422 for a cursor)."""

from __future__ import annotations

import re

JOB_PREFIX, EVENT_PREFIX, CHECKPOINT_PREFIX = "ftjob-", "ftevent-", "ftckpt-"
# A positive BIGINT in ASCII digits, no leading zero.
_ID = r"([1-9][0-9]{0,18})"
_JOB = re.compile(JOB_PREFIX + _ID)
_EVENT = re.compile(EVENT_PREFIX + _ID)
_CHECKPOINT = re.compile(CHECKPOINT_PREFIX + _ID + "-" + r"([1-9][0-9]{0,9})")
MAX_ID, MAX_STEP = 2**63 - 1, 2**31 - 1


def job_ref(job_id: int) -> str:
    return f"{JOB_PREFIX}{job_id}"


def parse_job_ref(text: str) -> int | None:
    """``"ftjob-7"`` -> 7; None for anything else (``"7"``, ``"ftjob-07"``, another prefix)."""
    return _number(_JOB.fullmatch(text))


def event_ref(event_id: int) -> str:
    return f"{EVENT_PREFIX}{event_id}"


def parse_event_ref(text: str) -> int | None:
    return _number(_EVENT.fullmatch(text))


def checkpoint_ref(job_id: int, step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{job_id}-{step}"


def parse_checkpoint_ref(text: str) -> tuple[int, int] | None:
    """``"ftckpt-7-40"`` -> ``(7, 40)``; None for anything else."""
    match = _CHECKPOINT.fullmatch(text)
    job_id = _number(match)
    if match is None or job_id is None or int(match.group(2)) > MAX_STEP:
        return None
    return job_id, int(match.group(2))


def _number(match: re.Match[str] | None) -> int | None:
    found = None if match is None else int(match.group(1))
    return found if found is not None and found <= MAX_ID else None
