"""A submission's blocking work off the event loop, a bounded number at a time.

Parsing a megabyte of JSON or YAML, validating it as a JobSpec and checking it against the
filesystem and the database take tens of milliseconds of CPU each; on the event loop they stalled
every other team's requests for as long. Here a submission (or clone) reads its raw body on the
loop and does the rest in one threadpool hop, at most ``GRPO_SPEC_VALIDATION_SLOTS`` at once: more
wait their turn on the loop, holding no thread, so a flood of large specs can neither take every
thread of the pool (which every sync route and SQL lookup shares) nor keep the GIL from the loop
with many threads at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.domain.errors import InvalidInput
from api.domain.job_spec import JobSpec
from api.http.yaml_body import YAML_MEDIA_TYPES, parse_yaml
from grpo_core.errors import SpecError
from grpo_core.spec.spec_file import InvalidSpec, field_path, spec_error_reason

T = TypeVar("T")


class SpecIntake:
    """One per app (``app.state``): the slots submissions take turns on, and how many are in each
    state now (``grpo_spec_intake`` on ``/metrics``). Used from the event loop only."""

    def __init__(self, slots: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self.running = 0
        self.waiting = 0

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            # Not abandoned if the request is cancelled (anyio waits for the thread): the slot is
            # held for as long as its thread runs.
            return await run_in_threadpool(work, *args)
        finally:
            self.running -= 1
            self._slots.release()


def slots_on(state: Any, name: str, slots: int) -> SpecIntake:
    """The app's (``app.state``) slots called ``name``, made with ``slots`` on first use."""
    found = getattr(state, name, None)
    if found is None:
        found = SpecIntake(slots)
        setattr(state, name, found)
    return found


def intake(state: Any) -> SpecIntake:
    return slots_on(state, "spec_intake", state.settings.spec_validation_slots)


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def parse_spec(raw: bytes, content_type: str | None) -> JobSpec:
    """The body as a JobSpec: JSON, or YAML (plain data only) for a YAML media type. Errors are
    :class:`InvalidSpec` located like the spec's fields (``grpo.num_generations``), or ``body``
    for what is no JSON/YAML object at all."""
    if media_type(content_type) in YAML_MEDIA_TYPES:
        try:
            data = parse_yaml(raw)
        except (yaml.YAMLError, ValueError) as exc:
            raise InvalidSpec([SpecError("body", f"not valid YAML: {exc}")]) from None
        # default=str: YAML has types JSON has not (dates); validation then names the field.
        raw = json.dumps(data, default=str).encode()
    try:
        return JobSpec.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidSpec(_located(exc)) from None


def _located(exc: ValidationError) -> list[SpecError]:
    # A JSON syntax error's location is no field, nor is a body that is no object; a field the
    # spec does not have is told as the name it probably meant (spec_error_reason).
    return [SpecError("body", err["msg"]) if err["type"] == "json_invalid" or not err["loc"]
            else SpecError(field_path(err["loc"]), spec_error_reason(err, JobSpec))
            for err in exc.errors(include_url=False)]


def parse_changes(raw: bytes) -> dict[str, Any]:
    """A clone's body: an object of fields to change (none, or ``null``: no change)."""
    if not raw.strip():
        return {}
    try:
        changes = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"body: not valid JSON: {exc}", param="body") from None
    if changes is None:
        return {}
    if not isinstance(changes, dict):
        raise InvalidInput("body: must be an object of the fields to change", param="body")
    return changes
