"""What clients are sent: stream entries (``api.store.bus`` shapes, which the SQL catch-up reuses)
become client messages, encoded once as JSON text for every connection that gets them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.schemas.jobs import JobRead, member_event_data
from api.store import bus
from api.streaming.cursor import StreamId, parse_id

EVENT_FIELDS = ("id", "ts", "level", "type", "message", "data")


def to_client(kind: str, data: dict[str, Any], job: JobRead | None = None) -> dict[str, Any]:
    """A stream entry → the client message (a status carries the job's row as ``job``)."""
    if kind == "metrics":
        return {"type": "metrics", "step": int(data["step"]), "values": data}
    if kind == "samples":
        return {"type": "samples", "step": int(data["step"]), "rows": data["rows"]}
    if kind == "event":  # as members see it, like the status below
        event = {name: data.get(name) for name in EVENT_FIELDS}
        if isinstance(event["data"], dict):
            event["data"] = member_event_data(event["data"])
        return {"type": "event", "event": event}
    if kind == "status":
        # One encoding serves every subscriber, admins included: the member's view of the job
        # (no server paths). An admin reads the paths from ``GET /v1/jobs/{id}`` and its events.
        return {
            "type": "status",
            "status": data["status"],
            "job": job.for_member().model_dump(mode="json") if job is not None else None,
        }
    raise ValueError(f"unknown message type '{kind}'; valid: {', '.join(bus.MESSAGE_TYPES)}")


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)  # as send_json does


def needs_sql(kind: str, data: dict[str, Any]) -> bool:
    """A status is sent from the job's row (the truth, and it carries the JobRead); an event
    published without its row id cannot be de-duplicated, so its row is fetched instead."""
    return kind == "status" or (kind == "event" and not isinstance(data.get("id"), int))


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry, decoded and translated once for every subscriber."""

    id: StreamId
    kind: str
    data: dict[str, Any]
    text: str | None  # the client message as JSON; None: SQL must send it (``needs_sql``)

    @classmethod
    def read(cls, raw_id: bytes | str, fields: dict) -> Entry:
        message = bus.decode(fields)
        kind, data = message["type"], message["data"]
        text = None if needs_sql(kind, data) else encode(to_client(kind, data))
        return cls(parse_id(raw_id), kind, data, text)
