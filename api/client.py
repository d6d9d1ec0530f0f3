"""A small HTTP/WebSocket client of the service, used by ``grpo submit [--watch]``.

It speaks only the public API (``POST /v1/jobs``, ``GET /v1/jobs/{id}``, the WebSocket
``/v1/jobs/{id}/stream?after=N``), so it works against a remote deployment exactly as against
``grpo dev``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

TERMINAL = ("succeeded", "failed", "cancelled")
NOTABLE_EVENTS = ("running", "requeued", "resumed", "checkpoint", "stopped", "cancel_requested",
                  "preempt_requested", "preempted", "priority_changed")
SHOWN = (("reward", "reward"), ("kl", "kl"), ("clip_ratio/region_mean", "clip"), ("loss", "loss"))


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class ApiClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def _json(self, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json(self.http.post("/v1/jobs", json=spec, headers=headers))

    def job(self, job_id: int) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/jobs/{job_id}"))

    def stream_url(self, job_id: int, after: int = 0, after_event: int = 0) -> str:
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = f"{parts.path}/v1/jobs/{job_id}/stream"
        return urlunsplit((scheme, parts.netloc, path, f"after={after}&after_event={after_event}", ""))

    def watch(self, job_id: int, on_message: Callable[[dict[str, Any]], None], retries: int = 5) -> str:
        """Follow the stream until a terminal status; a reconnect resumes after the last step seen
        (the server sends each step once per connection, from SQL first, then live)."""
        last_step = last_event = 0
        for _ in range(retries + 1):
            try:
                with connect(self.stream_url(job_id, last_step, last_event), additional_headers=self.headers,
                             open_timeout=30) as ws:
                    for raw in ws:
                        message = json.loads(raw)
                        if message.get("type") == "metrics":
                            last_step = max(last_step, message["step"])
                        elif message.get("type") == "event":
                            last_event = max(last_event, message["event"].get("id") or 0)
                        on_message(message)
                        if message.get("type") == "status" and message.get("status") in TERMINAL:
                            return message["status"]
            except (ConnectionClosed, InvalidHandshake, OSError):
                pass
            status = self.job(job_id)["status"]  # the stream ended early: SQL knows the truth
            if status in TERMINAL:
                return status
            time.sleep(1.0)
        raise ApiError(0, f"lost the stream of job {job_id} {retries + 1} times")


def format_message(message: dict[str, Any], max_steps: int | None = None) -> str | None:
    """One terminal line per step or notable event; None for what is not worth a line."""
    kind = message.get("type")
    if kind == "metrics":
        step = f"{message['step']}/{max_steps}" if max_steps else str(message["step"])
        values = "  ".join(f"{label} {_num(message['values'].get(key))}" for key, label in SHOWN)
        return f"step {step:>9}  {values}"
    event = message.get("event") or {}
    if kind == "event" and event.get("type") in NOTABLE_EVENTS:
        return f"[{event['type']}] {event.get('message', '')}"
    if kind == "status" and message.get("status") not in TERMINAL:
        return f"status: {message.get('status')}"
    return None  # the final status is printed from the job record, which has the error too


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def watch_to(out: TextIO, client: ApiClient, job_id: int, max_steps: int | None) -> str:
    def show(message: dict[str, Any]) -> None:
        line = format_message(message, max_steps)
        if line:
            print(line, file=out, flush=True)

    return client.watch(job_id, show)
