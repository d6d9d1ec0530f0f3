"""Where a reader stands: Redis stream ids, and the cursor that drops what a client already has."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from api.vocabulary import BEFORE_FIRST_STEP

StreamId = tuple[int, int]  # (milliseconds, sequence): ordered as Redis orders entry ids


def parse_id(raw: bytes | str) -> StreamId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(stream_id: StreamId) -> str:
    return f"{stream_id[0]}-{stream_id[1]}"


@dataclass
class Cursor:
    """What this client has been sent; everything at or before it is a duplicate."""

    step: int = BEFORE_FIRST_STEP  # step 0 is a record too: the evaluation before training
    sample_step: int = BEFORE_FIRST_STEP
    event_id: int = 0
    status: str | None = None

    def admit(self, kind: str, data: dict[str, Any]) -> bool:
        """True (and move past it) the first time a step, sample step, event or status is seen."""
        if kind == "status":
            fresh = data["status"] != self.status
            self.status = data["status"]
            return fresh
        name = _CURSOR_FIELDS[kind]
        number = int(data["id"] if kind == "event" else data["step"])
        if number <= getattr(self, name):
            return False
        setattr(self, name, number)
        return True

    @classmethod
    def lowest(cls, cursors: Iterable[Cursor]) -> Cursor:
        """The floor of several cursors (no status): one SQL read from it serves every one."""
        cursors = list(cursors)
        return cls(*(min(getattr(c, name) for c in cursors) for name in _CURSOR_FIELDS.values()))


_CURSOR_FIELDS = {"metrics": "step", "samples": "sample_step", "event": "event_id"}
