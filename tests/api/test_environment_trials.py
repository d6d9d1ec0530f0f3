"""``POST /v1/environments/run``: a spec's environment plays one episode on scripted actions over
real HTTP, in this host's real sandbox, without a model or a job; what would not validate, cannot
run or fails as it would fail a job is a 422 naming ``environment``, with nothing queued."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sandbox_guard import needs_sandbox
from test_jobs_api import row_counts

from api.schemas.environment_trials import MAX_ACTIONS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "environment.yaml"
GAME = ("class Environment:\n"
        "    def reset(self, item):\n"
        "        self.target, self.said = item['target'], []\n"
        "        return 'Guess.'\n"
        "    def step(self, action):\n"
        "        self.said.append(action)\n"
        "        right = action == str(self.target)\n"
        "        return {'observation': None if right else f'no ({len(self.said)} tries)',\n"
        "                'reward': 1.0 if right else 0.1, 'done': right}\n")


def play(client, actions: list[str], environment: dict | None = None, **fields):
    body = {"environment": environment or {"source": GAME}, "item": {"target": 7}, "actions": actions,
            **fields}
    return client.post("/v1/environments/run", json=body)



@needs_sandbox
def test_an_episode_is_played_on_the_actions_until_done_keeping_its_state(member, api_server) -> None:
    before = row_counts(api_server.settings.database_url)
    response = play(member, ["3", "5", "7", "9"])
    assert response.status_code == 200, response.text
    episode = response.json()
    assert episode["first_observation"] == "Guess."
    assert [(s["action"], s["observation"], s["reward"], s["done"]) for s in episode["steps"]] == [
        ("3", "no (1 tries)", 0.1, False), ("5", "no (2 tries)", 0.1, False), ("7", None, 1.0, True)]
    assert episode["total_reward"] == pytest.approx(1.2)
    assert episode["done"] and episode["unused_actions"] == 1
    assert row_counts(api_server.settings.database_url) == before  # nothing queued


@needs_sandbox
def test_the_example_spec_text_is_tried_as_the_dashboard_sends_it(member) -> None:
    body = {"spec": EXAMPLE.read_text(), "item": {"target": 7}, "actions": ["I say 4", "then 7"]}
    response = member.post("/v1/environments/run", json=body)
    assert response.status_code == 200, response.text
    steps = response.json()["steps"]
    assert steps[0]["observation"] == "No: higher." and steps[1]["reward"] == 1.0 and steps[1]["done"]


@needs_sandbox
@pytest.mark.parametrize(("environment", "param", "said"), [
    ({"source": "x = 1\n"}, "environment.source", "class Environment"),
    ({"source": GAME, "max_turns": 0}, "environment.max_turns", "greater than or equal to 1"),
    ({"source": GAME.replace("self.said = item['target'], []", "self.said = item['nope'], []")},
     "environment", "reset raised KeyError: 'nope'"),
    ({"source": GAME.replace("'done': right}", "'done': 1}")},
     "environment", "done is int, not a bool"),
    ({"source": GAME.replace("self.said.append(action)", "while True: pass"), "timeout_seconds": 1},
     "environment", "ran out of time"),
])
def test_an_environment_that_would_fail_a_job_is_a_422_naming_it(member, environment, param, said) -> None:
    response = play(member, ["1"], environment)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and said in error["message"], error


def test_a_request_is_bounded(member) -> None:
    too_many = play(member, ["1"] * (MAX_ACTIONS + 1))
    assert too_many.status_code == 422 and too_many.json()["error"]["param"] == "actions"
    both = member.post("/v1/environments/run", json={"environment": {"source": GAME}, "spec": "x: 1",
                                                     "actions": ["1"]})
    assert both.status_code == 422, both.text
    no_environment = member.post("/v1/environments/run", json={"spec": "rewards: []", "actions": ["1"]})
    assert no_environment.status_code == 422 and no_environment.json()["error"]["param"] == "spec"


@needs_sandbox
def test_grpo_env_run_plays_the_example_on_the_command_line(capsys, api_server, team_keys) -> None:
    from api.cli.main import main

    target = ["--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    capsys.readouterr()
    command = ["env", "run", str(EXAMPLE), "--item", '{"target": 5}', "--action", "8", "--action", "5",
               "--action", "1"]
    assert main([*command, *target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("reset") and "Guess a digit" in lines[0]
    assert "reward=0.1" in lines[1] and "'No: lower.'" in lines[1]
    assert "reward=1" in lines[2] and "done=True" in lines[2]
    assert lines[-1] == "total reward 1.1 (done, 1 action(s) unused)"
    assert main([*command, "--json", *target]) == 0
    assert json.loads(capsys.readouterr().out)["total_reward"] == pytest.approx(1.1)
    assert main(["env", "run", str(EXAMPLE), "--item", "[1]", "--action", "x", *target]) == 2
    assert "--item" in capsys.readouterr().err


def test_a_registered_environment_server_plays_the_episode_for_its_team_only(member, client_for,
                                                                              team_keys) -> None:
    """An OpenEnv server (tests/openenv_server.py) an admin registered for team alpha: its
    session plays the scripted actions; team beta cannot name it; a server gone is a 422 naming
    environment.server, not a 5xx."""
    from openenv_server import openenv_server

    name = f"games-{uuid.uuid4().hex[:8]}"
    admin = client_for(team_keys.admin)
    environment = {"server": name, "reset_columns": ["seed"], "observation_field": "prompt"}
    try:
        with openenv_server() as server:
            registered = admin.put(f"/v1/admin/verifiers/{name}", json={"team": "alpha", "url": server.url})
            assert registered.status_code == 200, registered.text
            body = {"environment": environment, "item": {"seed": 6}, "actions": ["5", "7", "1"]}  # target 7
            response = member.post("/v1/environments/run", json=body)
            assert response.status_code == 200, response.text
            episode = response.json()
            assert episode["first_observation"] == "Guess a digit from 1 to 9."
            assert [(s["observation"], s["reward"], s["done"]) for s in episode["steps"]] == [
                ("higher", 0.0, False), ("Right!", 1.0, True)]
            assert episode["unused_actions"] == 1 and server.sessions == 1
            other = client_for(team_keys.beta).post("/v1/environments/run", json=body)
            assert other.status_code == 422 and other.json()["error"]["param"] == "environment.server"
        gone = member.post("/v1/environments/run", json=body)
        assert gone.status_code == 422, gone.text
        assert gone.json()["error"]["param"] == "environment.server"
        assert "cannot be reached" in gone.json()["error"]["message"]
    finally:
        admin.delete(f"/v1/admin/verifiers/{name}")
