"""A verifier service for tests: a threaded ``http.server`` on a free local port, speaking the
``http_verifier`` wire format (:mod:`grpo_core.rewards.verifier_client`). It scores a row 1.0 when
the completion contains the row's ``answer`` column, else 0.0, and a test can script what the
next requests get instead: a status (with headers), nulls, a malformed body, a redirect, a hang.
Every request's headers and rows are recorded. Imported by name (tests/ is on sys.path)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_http import serving


@dataclass
class Seen:
    headers: dict[str, str]
    items: list[dict[str, Any]]


@dataclass
class VerifierServer:
    port: int = 0
    script: list[tuple[Any, ...]] = field(default_factory=list)  # what the next requests get, in order
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/score"

    def next_action(self) -> tuple[Any, ...]:
        with self.lock:
            return self.script.pop(0) if self.script else ("score",)


def _score(item: dict[str, Any]) -> float:
    return float(str(item["columns"].get("answer", "\0")) in item["completion"])


def _handler(server: VerifierServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet test output
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            # No longer in flight once its answer starts out: the client may read it, free its slot and
            # send the next request before this thread runs again, which would count one too many.
            self._done()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
            with server.lock:
                server.seen.append(Seen(dict(self.headers), items))
                server.in_flight += 1
                server.most_in_flight = max(server.most_in_flight, server.in_flight)
            self.counted = True
            try:
                self._answer(items, server.next_action())
            finally:
                self._done()

        def _done(self) -> None:
            if getattr(self, "counted", False):
                self.counted = False
                with server.lock:
                    server.in_flight -= 1

        def _answer(self, items: list[dict[str, Any]], action: tuple[Any, ...]) -> None:
            kind = action[0]
            if kind == "status":
                self._send(action[1], b"{}", action[2] if len(action) > 2 else None)
            elif kind == "hang":
                time.sleep(action[1])
                self._send(200, json.dumps({"scores": [1.0] * len(items)}).encode())
            elif kind == "redirect":
                self._send(307, b"", {"Location": "http://127.0.0.1:9/elsewhere"})
            elif kind == "raw":
                self._send(200, action[1])
            else:
                scores: list[Any] = [_score(item) for item in items]
                if kind == "slow":
                    time.sleep(action[1])
                if kind == "entries":  # replace the first entries with these (None -> null)
                    scores[:len(action[1])] = action[1]
                self._send(200, json.dumps({"scores": scores}).encode())

    return Handler


@contextmanager
def verifier_server() -> Iterator[VerifierServer]:
    state = VerifierServer()
    with serving(_handler(state)) as state.port:
        yield state


def closed_port_url() -> str:
    """A local URL nothing listens on (a port just bound and released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"
