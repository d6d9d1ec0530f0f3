"""The WebSocket stream in the API's OpenAPI description (FastAPI leaves WebSockets out): its
path, parameters, messages and close codes, with every schema reference resolving."""

from __future__ import annotations

import json


def refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(value) for value in node)) if node else set()
    return set()


def test_the_stream_is_described_with_its_messages_and_close_codes(api) -> None:
    doc = api.get("/openapi.json").json()
    stream = doc["paths"]["/v1/jobs/{job_id}/stream"]["get"]
    assert {p["name"] for p in stream["parameters"]} >= {"job_id", "after", "after_event", "ticket"}
    assert "101" in stream["responses"] and "Authorization: Bearer" in stream["description"]
    websocket = stream["x-websocket"]
    assert {m["$ref"].rsplit("/", 1)[1] for m in websocket["messages"]} == {
        "MetricsMessage", "EventMessage", "SamplesMessage", "StatusMessage"}
    assert {"1000", "1011", "1013", "4401"} <= set(websocket["close_codes"])
    status = doc["components"]["schemas"]["StatusMessage"]
    assert status["properties"]["job"] == {"$ref": "#/components/schemas/JobRead"}
    components = doc["components"]["schemas"]
    missing = {ref for ref in refs(doc) if ref.rsplit("/", 1)[1] not in components}
    assert not missing, missing
    json.dumps(doc)  # still plain JSON
