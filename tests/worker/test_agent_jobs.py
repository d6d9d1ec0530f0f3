"""Agent jobs through the worker's real attempt. A tools job (job process body, SQL, Redis, the sandbox): a
tiny model fitted to call its tool (tests/tool_models.py) runs two-turn episodes, its tool calls
run in the sandbox, and the job's metrics (turns, tool calls, tool errors) and samples (the
conversation: the call, the tool's message, the answer) reach SQL as any step's do; evaluation
runs its episodes the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from openenv_server import openenv_server
from sandbox_guard import needs_sandbox
from tool_models import QUESTIONS, TOOLS, save_tool_user

from api.schemas.verifiers import VerifierSet
from api.store.db import session_scope
from api.store.teams import DEFAULT_TEAM
from api.store.telemetry import list_metrics, list_samples
from api.store.verifiers import delete_verifier, set_verifier

pytestmark = [needs_sandbox, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def tool_user(roots, tmp_path_factory) -> str:
    save_tool_user(roots["models"] / "tool-user", tmp_path_factory.mktemp("tool-user"))
    return "path:tool-user"


def run_to_success(run_in_process, submit, database_url: str, spec: dict) -> tuple[list[dict], list[dict]]:
    """Submit ``spec``, run its attempt here, and return its steps' metrics and its samples."""
    job_id = submit(spec)
    job = run_in_process(job_id)
    assert job.status == "succeeded", job.error
    with session_scope(database_url) as session:
        metrics = [m.values for m in list_metrics(session, job_id)]
        samples = [row for page in list_samples(session, job_id) for row in page.rows]
    return metrics, samples


def test_a_tools_job_runs_its_episodes_and_records_their_turns_and_conversations(
        run_in_process, submit, tiny_spec, tool_user, database_url):
    prompts = {"prompts": [{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS]}
    spec = tiny_spec("agent", max_steps=2, model={"source": tool_user}, dataset=prompts, eval_dataset=prompts,
                     tools=[{"source": TOOLS}], rewards=[{"name": "contains", "args": {"text": "5"}}],
                     grpo={"max_completion_length": 120, "max_prompt_length": 768, "temperature": 0.7,
                           "max_tool_calling_iterations": 3, "eval_strategy": "steps", "eval_steps": 2,
                           "eval_num_generations": 2, "eval_temperature": 0},
                     log_completions_every=1)
    metrics, samples = run_to_success(run_in_process, submit, database_url, spec)
    assert len(metrics) == 2
    for values in metrics:
        assert 1.0 <= values["turns/mean"] <= values["turns/max"] <= 4.0
        assert values["tool_errors/frequency"] == 0.0  # every call the model wrote ran
    assert max(values["tool_calls/mean"] for values in metrics) > 0.5  # the tuned model calls its tool
    called = [row for row in samples if row["tool_calls"] > 0]
    assert called, samples
    row = called[0]
    assert row["messages"][0]["role"] == "assistant" and row["messages"][0]["tool_calls"][0]["function"] == {
        "name": "add", "arguments": {"a": 2, "b": 3}}
    assert row["messages"][1] == {"role": "tool", "name": "add", "content": "5"}
    assert row["turns"] == len([m for m in row["messages"] if m["role"] == "assistant"])
    # Evaluation runs episodes the same way (greedy here: the tuned path, every time).
    assert metrics[-1]["eval_turns/mean"] == 2.0 and metrics[-1]["eval_tool_calls/mean"] == 1.0
    assert metrics[-1]["eval_reward"] == 1.0  # its answer, "5", after the tool's result


def test_an_environment_job_plays_its_episodes_and_its_reward_rises(
        run_in_process, submit, database_url, task_settings, monkeypatch):
    """examples/environment.yaml (guess-the-number) on the tiny model, through the real attempt:
    each episode's environment runs in a sandbox of its own, and over 20 steps the reward rises
    (measured: 0.003 at step 1, 0.13 at step 20, ~0.8 from 35 on)."""
    # Run in this process, the attempt renews no lease: it holds one long enough for its minute.
    monkeypatch.setenv("GRPO_LEASE_SECONDS", "600")
    task_settings.lease_seconds = 600.0
    spec = yaml.safe_load((EXAMPLES / "environment.yaml").read_text())
    spec.update(model={"source": "path:tiny"}, checkpoint_every=10, log_completions_every=5)
    spec["grpo"]["max_steps"] = 20
    metrics, samples = run_to_success(run_in_process, submit, database_url, spec)
    assert len(metrics) == 20
    for values in metrics:
        assert values["env_reward/mean"] == pytest.approx(values["rewards/environment/mean"])
        assert 1.0 <= values["turns/mean"] <= values["turns/max"] <= 3.0
    early = sum(v["reward"] for v in metrics[:5]) / 5
    late = sum(v["reward"] for v in metrics[-5:]) / 5
    assert late > early + 0.02, [round(v["reward"], 3) for v in metrics]
    played = [row for row in samples if row["turns"] > 1]
    assert played, samples
    row = played[0]
    turns = [m for m in row["messages"] if m["role"] == "assistant"]
    assert len(turns) == row["turns"] and all("reward" in m for m in turns)
    assert row["messages"][1]["role"] == "user" and row["messages"][1]["content"].startswith(("No:", "Say"))
    assert row["env_reward"] == pytest.approx(sum(m["reward"] or 0.0 for m in turns))


def test_an_environment_server_job_plays_each_episode_in_a_session_of_its_own(
        run_in_process, submit, database_url, task_settings, monkeypatch, tiny_spec):
    """The guess game served over OpenEnv's protocol (tests/openenv_server.py), registered for the
    job's team; the worker reaches it through the egress guard the operator opened to loopback."""
    monkeypatch.setenv("GRPO_ENVIRONMENT_ALLOWED_NETWORKS", "127.0.0.0/8")
    task_settings.environment_allowed_networks = "127.0.0.0/8"
    prompts = [{"prompt": [{"role": "user", "content": "Guess."}], "seed": seed} for seed in range(4)]
    spec = tiny_spec("served", max_steps=2, rewards=[], dataset={"prompts": prompts},
                     environment={"server": "games", "max_turns": 3, "reset_columns": ["seed"],
                                  "observation_field": "prompt"},
                     grpo={"max_completion_length": 24, "num_generations": 2}, log_completions_every=1)
    with openenv_server() as server:
        with session_scope(database_url) as session:
            set_verifier(session, "games", VerifierSet(team=DEFAULT_TEAM, url=server.url))
        try:
            metrics, samples = run_to_success(run_in_process, submit, database_url, spec)
        finally:
            with session_scope(database_url) as session:
                delete_verifier(session, "games")
    assert len(metrics) == 2 and all("env_reward/mean" in values for values in metrics)
    assert server.sessions == 2 * 2 * 2  # steps × prompts × generations: one session an episode
    assert samples[0]["messages"][0]["role"] == "assistant" and "reward" in samples[0]["messages"][0]
