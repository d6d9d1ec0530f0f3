"""A webhook receiver for tests: a threaded ``http.server`` on a local port that records every
request (headers and exact body bytes) and answers 204, unless a test scripted what the next
requests get: another status, a hang of some seconds first, a wait for an event (a receiver
that hangs until the test lets it go), or an answer trickled a byte at a time. Imported by name
(tests/ is on sys.path), like ``verifier_server``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_http import serving


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int
    # ("status", 500), ("hang", seconds), ("block", threading.Event) or ("trickle", seconds a byte)
    script: list[tuple[str, Any]] = field(default_factory=list)
    always: tuple[str, Any] | None = None  # what every request gets once the script is done
    seen: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return receiver_url(self.port)

    def next_action(self) -> tuple[str, Any]:
        with self.lock:
            return self.script.pop(0) if self.script else (self.always or ("status", 204))


def receiver_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/hooks"


def free_port() -> int:
    """A local port nothing listens on (bound and released): a receiver that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _handler(state: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet test output
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with state.lock:
                state.seen.append(Received(dict(self.headers), body))
            kind, value = state.next_action()
            if kind == "trickle":  # an answer that keeps coming, a byte at a time, never quite done
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Slow: " + b"." * 200:
                    time.sleep(value)
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:  # the sender hung up: what the test wants
                        break
                self.close_connection = True
                return
            if kind == "hang":
                time.sleep(value)
                value = 200
            if kind == "block":
                value.wait(60)
                value = 200
            self.send_response(value)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


@contextmanager
def webhook_receiver(port: int = 0) -> Iterator[Receiver]:
    """A receiver listening on ``port`` (0: one the OS picks) until the block ends."""
    state = Receiver(port)
    with serving(_handler(state), port) as state.port:
        yield state
