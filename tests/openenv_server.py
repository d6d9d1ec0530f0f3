"""A small OpenEnv-protocol environment server for the tests, in a thread on a free loopback port:
OpenEnv's stateful WebSocket protocol on ``/ws`` (``{"type": "reset"|"step"|"close", "data"}`` in,
``{"type": "observation", "data": {"observation", "reward", "done"}}`` or ``{"type": "error"}``
out), one game per connection: guess-the-number, the target the reset's ``seed`` mod 9 + 1.

``token``: the ``Authorization`` value a session must open with (else the handshake is refused
401, as a server behind auth would). ``sessions`` counts the sessions opened; ``headers`` keeps
each one's request headers."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from websockets.sync.server import ServerConnection, serve


@dataclass
class OpenEnvServer:
    url: str  # the base URL an admin registers (http://127.0.0.1:PORT)
    sessions: int = 0
    headers: list[Any] = field(default_factory=list)  # websockets' Headers: names case-insensitive


def _observation(observation: dict[str, Any], reward: float | None, done: bool) -> str:
    return json.dumps({"type": "observation", "data": {"observation": observation, "reward": reward,
                                                       "done": done}})


def _play(connection: ServerConnection, server: OpenEnvServer) -> None:
    server.sessions += 1
    server.headers.append(connection.request.headers)
    target, tries = 5, 0
    for raw in connection:
        message = json.loads(raw)
        kind, data = message.get("type"), message.get("data") or {}
        if kind == "close":
            return
        if kind == "reset":
            target, tries = int(data.get("seed", 4)) % 9 + 1, 0
            connection.send(_observation({"prompt": "Guess a digit from 1 to 9.", "tries": 0, "metadata": {}},
                                         None, False))
        elif kind == "step":
            text = data.get("message")
            if not isinstance(text, str):
                connection.send(json.dumps({"type": "error", "data": {"message": "action needs 'message'"}}))
                continue
            tries += 1
            digits = re.findall(r"[1-9]", text)
            if digits and int(digits[0]) == target:
                connection.send(_observation({"prompt": "Right!", "tries": tries}, 1.0, True))
            else:
                hint = "Say a digit." if not digits else ("higher" if int(digits[0]) < target else "lower")
                connection.send(_observation({"prompt": hint, "tries": tries}, 0.0, False))
        else:
            connection.send(json.dumps({"type": "error", "data": {"message": f"unknown type {kind}"}}))


@contextmanager
def openenv_server(token: str | None = None) -> Iterator[OpenEnvServer]:
    """The server, running until the block ends."""
    holder: dict[str, OpenEnvServer] = {}

    def refuse_unauthorised(connection: ServerConnection, request: Any) -> Any:
        if request.path != "/ws":
            return connection.respond(HTTPStatus.NOT_FOUND, "OpenEnv's sessions are at /ws\n")
        if token is not None and request.headers.get("Authorization") != token:
            return connection.respond(HTTPStatus.UNAUTHORIZED, "no\n")
        return None

    with serve(lambda connection: _play(connection, holder["server"]), "127.0.0.1", 0,
               process_request=refuse_unauthorised) as running:
        port = running.socket.getsockname()[1]
        holder["server"] = OpenEnvServer(f"http://127.0.0.1:{port}")
        thread = threading.Thread(target=running.serve_forever, name="openenv-server", daemon=True)
        thread.start()
        try:
            yield holder["server"]
        finally:
            running.shutdown()
            thread.join(timeout=10)
