"""The pure parts of the live stream: stream ids, cursors and entry translation."""

from __future__ import annotations

import json

from api.store import bus
from api.streaming.cursor import Cursor, format_id, parse_id
from api.streaming.messages import Entry, encode, to_client


def as_redis_returns(kind: str, data: dict) -> dict[bytes, bytes]:
    return {key.encode(): value.encode() for key, value in bus.encode(kind, data).items()}


def test_stream_ids_order_as_redis_orders_them() -> None:
    assert parse_id(b"10-0") > parse_id("9-5") > parse_id("9-4")
    assert parse_id("7") == (7, 0)
    assert format_id(parse_id(b"1712345678901-3")) == "1712345678901-3"


def test_an_entry_is_sent_as_it_is_unless_only_sql_can_send_it() -> None:
    record = {"step": 3, "reward": 0.5, "note": "é→"}
    metrics = Entry.read(b"5-1", as_redis_returns("metrics", record))
    assert metrics.id == (5, 1) and metrics.kind == "metrics" and metrics.data == record
    assert json.loads(metrics.text) == to_client("metrics", record)
    assert "é→" in metrics.text  # non-ASCII kept, as starlette's send_json sends it
    event = {"id": 9, "ts": "2025-01-01T00:00:00Z", "level": "info", "type": "note", "message": "m",
             "data": {}}
    assert Entry.read("6-0", as_redis_returns("event", event)).text == encode(to_client("event", event))
    # A status goes out with the job's row, an event without its row id from SQL: no text here.
    assert Entry.read("7-0", as_redis_returns("status", {"status": "running"})).text is None
    assert Entry.read("8-0", as_redis_returns("event", {"type": "note", "message": "m"})).text is None


def test_the_lowest_cursor_is_the_floor_of_each_field() -> None:
    floor = Cursor.lowest([Cursor(step=5, sample_step=2, event_id=9, status="running"),
                           Cursor(step=3, sample_step=4, event_id=11)])
    assert floor == Cursor(step=3, sample_step=2, event_id=9)
