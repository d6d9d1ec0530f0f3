"""An environment's episodes played on an OpenEnv server an admin registered: each episode is a
session of its own, a WebSocket to the server's ``/ws`` (OpenEnv's stateful protocol; its HTTP
``/reset`` and ``/step`` make a fresh environment per request, so they hold no episode):

    {"type": "reset", "data": {<the item's reset_columns>}} -> {"type": "observation", "data": {...}}
    {"type": "step", "data": {<action_field>: "<the model's turn>"}} -> {"type": "observation", "data": {...}}
    {"type": "close"}

where an observation's ``data`` is ``{"observation": {...}, "reward": r, "done": d}`` and a
failure ``{"type": "error", "data": {"message": ...}}``. The text the model sees is the
observation's ``observation_field`` (or the whole observation as JSON, its reward, done and
metadata left out).

Every connection goes through the egress guard (:func:`grpo_core.egress.connect_checked`): the
server's host resolved once and checked (public addresses, or the operator's allowed networks),
the socket connected to that address. The registration's auth header goes with each session's
opening request and is never shown. Calls run at most the registration's ``max_concurrency`` at
once, each within its ``timeout_seconds``.

Two kinds of failure: the server's answer to a call (an error, an answer not in the protocol's
shape, a reward that is no number) is the job's (``environment_error``, as an Environment
class's); the server unreachable, a session dropped or a call unanswered in time is the
infrastructure's (:class:`~grpo_core.errors.EnvironmentUnavailable`: the job resumes from its
checkpoint once the server is back).
"""

from __future__ import annotations

import json
import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect

from grpo_core.agents.environment_answers import Episodes, StepResult, failure, json_object, step_result
from grpo_core.egress import DestinationRefused, Unresolved, connect_checked
from grpo_core.errors import EnvironmentUnavailable

if TYPE_CHECKING:
    from grpo_core.agents.environment_setup import EnvironmentSetup

MESSAGE_BYTES = 1 << 20  # the most of one message a server may send


class ServerEpisodes(Episodes):
    """``len(items)`` sessions opened and reset on their items; use as a context manager, which
    closes every session. ``first_observations[i]``: the text of episode ``i``'s first observation."""

    def __init__(self, setup: EnvironmentSetup, items: list[dict[str, Any]]) -> None:
        self.setup = setup
        assert setup.server is not None
        self.sessions: list[ClientConnection | None] = [None] * len(items)
        self._pool = ThreadPoolExecutor(
            max(1, min(setup.server.max_concurrency, len(items))), thread_name_prefix="env-server"
        )
        try:
            self.first_observations = list(self._pool.map(self._start, range(len(items)), items))
        except BaseException:
            self.close()
            raise

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Each episode's ``step`` on its action, at most ``max_concurrency`` at once."""
        episodes = list(actions)
        field = self.setup.action_field
        answers = self._pool.map(
            lambda i: self._call(i, {"type": "step", "data": {field: actions[i]}}, "step"), episodes
        )
        return {i: self._result(i, data) for i, data in zip(episodes, answers, strict=True)}

    def finish(self, episode: int) -> None:
        """Close one episode's session now (it is done)."""
        session, self.sessions[episode] = self.sessions[episode], None
        if session is not None:
            try:
                session.send(json.dumps({"type": "close"}))
            except (OSError, WebSocketException):
                pass  # closing anyway
            session.close()

    def close(self) -> None:
        for episode in range(len(self.sessions)):
            self.finish(episode)
        self._pool.shutdown(wait=True)

    def _start(self, episode: int, item: dict[str, Any]) -> str | None:
        self.sessions[episode] = self._open()
        data = {name: item[name] for name in self.setup.reset_columns if name in item}
        answer = self._call(episode, {"type": "reset", "data": data}, "reset")
        return self._text(episode, answer.get("observation"))

    def _open(self) -> ClientConnection:
        server = self.setup.server
        parts = urlsplit(server.url)
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        path = parts.path.rstrip("/") + "/ws"
        uri = f"{'wss' if secure else 'ws'}://{parts.netloc}{path}"
        try:
            sock = connect_checked(parts.hostname, port, self.setup.egress, server.timeout_seconds)
        except DestinationRefused as exc:
            raise EnvironmentUnavailable(
                f"the environment server's address is refused by the egress guard: "
                f"{exc} (the operator allows networks with "
                "GRPO_ENVIRONMENT_ALLOWED_NETWORKS)"
            ) from None
        except (Unresolved, OSError) as exc:
            raise EnvironmentUnavailable(
                f"the environment server cannot be reached: {type(exc).__name__}: {exc}"
            ) from None
        try:
            # As a context manager (websockets' way): the session's exit closes it and its socket.
            return connect(
                uri,
                sock=sock,
                additional_headers=server.headers(),
                open_timeout=server.timeout_seconds,
                close_timeout=1,
                max_size=MESSAGE_BYTES,
                proxy=None,
                ssl=ssl.create_default_context() if secure else None,
                server_hostname=parts.hostname if secure else None,
            ).__enter__()
        except (OSError, WebSocketException, TimeoutError) as exc:
            sock.close()
            raise EnvironmentUnavailable(
                f"the environment server refused a session: {type(exc).__name__}: {exc}"
            ) from None

    def _call(self, episode: int, message: dict[str, Any], call: str) -> dict[str, Any]:
        session = self.sessions[episode]
        if session is None:
            raise ValueError(f"episode {episode} has ended")
        try:
            session.send(json.dumps(message, default=str))
            raw = session.recv(timeout=self.setup.timeout_seconds)
        except TimeoutError:
            raise EnvironmentUnavailable(
                f"the environment server did not answer {call} within "
                f"{self.setup.timeout_seconds:g} s (episode {episode})"
            ) from None
        except (OSError, WebSocketException) as exc:
            raise EnvironmentUnavailable(
                f"the environment server dropped episode {episode}'s session at {call}: {type(exc).__name__}"
            ) from None
        answer = json_object(raw, call, episode)
        data = answer.get("data")
        if answer.get("type") == "error":
            message_text = data.get("message", data) if isinstance(data, dict) else data
            raise failure(f"server answered {call} with an error: {str(message_text)[:500]}", episode)
        if answer.get("type") != "observation" or not isinstance(data, dict):
            raise failure(
                f"server answered {call} with a '{str(answer.get('type'))[:40]}' message, not an observation",
                episode,
            )
        return data

    def _result(self, episode: int, data: dict[str, Any]) -> StepResult:
        text = self._text(episode, data.get("observation"))
        return step_result(
            {"result": {"observation": text, "reward": data.get("reward"), "done": data.get("done", False)}},
            episode,
        )

    def _text(self, episode: int, observation: Any) -> str | None:
        """What the model sees of an observation."""
        if observation is None or isinstance(observation, str):
            return observation
        if not isinstance(observation, dict):
            return json.dumps(observation, default=str)
        field = self.setup.observation_field
        if field is not None:
            if field not in observation:
                raise failure(f"server's observation has no field '{field}' (observation_field)", episode)
            value = observation[field]
            return value if isinstance(value, str) or value is None else json.dumps(value, default=str)
        shown = {k: v for k, v in observation.items() if k not in ("reward", "done", "metadata")}
        return json.dumps(shown, default=str)
