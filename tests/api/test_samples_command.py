"""``grpo samples``: a job's kept samples on the command line, a multi-turn episode as its
conversation (turns, tool calls, each environment turn's reward, observations), a single-turn
row as its completion; read over real HTTP from rows in SQL."""

from __future__ import annotations

import json

from api.store.db import session_scope
from api.store.telemetry import record_samples

EPISODE = {"prompt": "Guess.", "completion": "3 7", "answer": "7", "reward": 1.1, "advantage": 0.5,
           "turns": 2, "tool_calls": 0, "tool_errors": 0, "env_reward": 1.1, "columns": {},
           "messages": [{"role": "assistant", "content": "3", "reward": 0.1},
                        {"role": "user", "content": "No: higher."},
                        {"role": "assistant", "content": "7", "reward": 1.0}]}
TOOLS = {"prompt": "2+3?", "completion": "5", "answer": "5", "reward": 1.0, "advantage": 0.0, "turns": 2,
         "tool_calls": 1, "tool_errors": 0, "columns": {},
         "messages": [{"role": "assistant", "content": "",
                       "tool_calls": [{"type": "function",
                                       "function": {"name": "add", "arguments": {"a": 2}}}]},
                      {"role": "tool", "name": "add", "content": "5"}, {"role": "assistant", "content": "5"}]}
PLAIN = {"prompt": "Is it yes?", "completion": "yes it is", "answer": "yes", "reward": 1.0, "advantage": 0.0,
         "columns": {}}


def test_grpo_samples_shows_episodes_as_conversations(api, api_server, job_spec, team_keys, capsys) -> None:
    from api.cli.main import main

    job_id = api.post("/v1/jobs", json=job_spec()).json()["id"]
    with session_scope(api_server.settings.database_url) as session:
        record_samples(session, job_id, 1, [PLAIN])
        record_samples(session, job_id, 2, [EPISODE, TOOLS])
    target = ["--api-url", api_server.http_url, "--api-key", team_keys.admin]
    capsys.readouterr()
    assert main(["samples", str(job_id), *target]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 2 #0 training  reward=1.1  advantage=0.5  turns=2"
    assert out[1:6] == ["  prompt: Guess.", "  conversation:", "    assistant (reward 0.1): 3",
                        "    user: No: higher.", "    assistant (reward 1): 7"]
    assert '    assistant: → add({"a": 2})' in out and "    tool add: 5" in out
    assert out[-2:] == ["  prompt: Is it yes?", "  completion: yes it is"]
    assert main(["samples", str(job_id), "--step", "1", "--json", *target]) == 0
    assert [page["step"] for page in json.loads(capsys.readouterr().out)["items"]] == [1]
