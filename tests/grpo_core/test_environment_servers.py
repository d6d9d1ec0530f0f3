"""Environments served by a registered OpenEnv server (tests/openenv_server.py, a real WebSocket
server on loopback): each episode is a session of its own that keeps its game, the registration's
auth header goes with it, observations map to text, the server's own errors are the job's
(``environment_error``) while an unreachable or silent server is the infrastructure's
(``environment_unavailable``), and the egress guard refuses loopback unless the operator allows it."""

from __future__ import annotations

import socket

import pytest
from openenv_server import openenv_server
from pydantic import ValidationError

from grpo_core.agents.environment_runner import open_episodes
from grpo_core.agents.environment_setup import EnvironmentSetup
from grpo_core.egress import EgressPolicy
from grpo_core.errors import EnvironmentUnavailable, GRPOError, SpecError
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.spec.environment_spec import EnvironmentSpec

LOOPBACK = EgressPolicy.from_cidrs(["127.0.0.0/8"])


def setup_for(url: str, egress: EgressPolicy = LOOPBACK, token: str | None = None,
              **fields) -> EnvironmentSetup:
    spec = EnvironmentSpec(server="games", reset_columns=["seed"], **fields)
    endpoint = VerifierEndpoint(url=url, auth_header="Authorization" if token else None, auth_secret=token,
                                timeout_seconds=fields.get("timeout_seconds", 5.0))
    return EnvironmentSetup.of(spec, {"games": endpoint}, egress)


def test_a_spec_names_a_source_or_a_server() -> None:
    with pytest.raises(ValidationError, match="not both"):
        EnvironmentSpec(source="class Environment:\n    def reset(self, item): pass\n"
                               "    def step(self, action): pass\n", server="games")
    with pytest.raises(ValidationError, match="not both"):
        EnvironmentSpec()
    with pytest.raises(SpecError, match="no environment server 'games'") as missing:
        EnvironmentSetup.of(EnvironmentSpec(server="games"), {})
    assert missing.value.field == "environment.server"


def test_each_episode_is_a_session_of_its_own_with_the_registrations_secret() -> None:
    with openenv_server(token="Bearer s3cret") as server:
        setup = setup_for(server.url, token="Bearer s3cret", observation_field="prompt")
        with open_episodes(setup, [{"seed": 2}, {"seed": 6}]) as episodes:  # targets 3 and 7
            assert episodes.first_observations == ["Guess a digit from 1 to 9."] * 2
            first = episodes.step({0: "I say 5", 1: "I say 5"})
            assert (first[0].observation, first[0].reward, first[0].done) == ("lower", 0.0, False)
            assert first[1].observation == "higher"
            second = episodes.step({0: "3", 1: "9"})
            assert second[0].done and second[0].reward == 1.0 and second[1].observation == "lower"
            episodes.finish(0)
            assert episodes.step({1: "7"})[1].done
        assert server.sessions == 2
        assert all(headers["Authorization"] == "Bearer s3cret" for headers in server.headers)
        assert "s3cret" not in repr(setup)


def test_the_whole_observation_is_shown_as_json_without_reward_done_or_metadata() -> None:
    with openenv_server() as server, open_episodes(setup_for(server.url), [{"seed": 1}]) as episodes:
        assert episodes.first_observations == ['{"prompt": "Guess a digit from 1 to 9.", "tries": 0}']


def test_the_servers_errors_are_the_jobs_and_its_absence_the_infrastructures() -> None:
    with openenv_server() as server:
        with open_episodes(setup_for(server.url, action_field="text"), [{"seed": 1}]) as episodes:
            with pytest.raises(GRPOError, match="error: action needs 'message'") as failed:
                episodes.step({0: "1"})
        assert failed.value.code == "environment_error"
        with pytest.raises(GRPOError, match="no field 'nope'"):
            open_episodes(setup_for(server.url, observation_field="nope"), [{"seed": 1}])
    with openenv_server(token="Bearer right") as guarded, pytest.raises(EnvironmentUnavailable,
                                                                          match="refused a session"):
        open_episodes(setup_for(guarded.url, token="Bearer wrong"), [{"seed": 1}])
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(EnvironmentUnavailable, match="cannot be reached") as away:
        open_episodes(setup_for(f"http://127.0.0.1:{port}"), [{"seed": 1}])
    assert away.value.code == "environment_unavailable"


def test_a_silent_server_is_unavailable_within_the_calls_time() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        # Accepts the connection (the kernel does) and never answers the WebSocket handshake.
        with pytest.raises(EnvironmentUnavailable, match="refused a session"):
            open_episodes(setup_for(f"http://127.0.0.1:{port}", timeout_seconds=1.0), [{"seed": 1}])


def test_the_egress_guard_refuses_loopback_unless_the_operator_allows_it() -> None:
    with openenv_server() as server:
        with pytest.raises(EnvironmentUnavailable, match="refused by the egress guard: .*loopback"):
            open_episodes(setup_for(server.url, egress=EgressPolicy()), [{"seed": 1}])
        assert server.sessions == 0
