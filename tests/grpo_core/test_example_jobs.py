"""The example jobs of examples/ run with ``grpo train`` on a CPU, each a couple of steps, with
the tiny local models .ci/bootstrap builds there (built here into a temporary copy instead).

``grpo train``'s ``main`` runs in this process (tests/grpo_core/test_cli.py runs it as a
subprocess): a subprocess would spend seconds importing torch before each run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from statistics import mean

import pytest
from sandbox_guard import needs_sandbox

from grpo_core.cli import main

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def tiny_reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_core.io.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-rm"), family="qwen2", num_labels=1)


def run_example(name: str, tmp_path: Path, models: dict[str, Path], *extra: str,
                steps: int = 2) -> list[dict]:
    folder = tmp_path / "examples"
    if not folder.exists():
        folder.mkdir()
        shutil.copy(EXAMPLES / name, folder / name)
        for link, target in models.items():
            (folder / link).symlink_to(target, target_is_directory=True)
    out = tmp_path / f"run{'-'.join(extra)}"
    command = ["train", str(folder / name), "--output-dir", str(out), "--max-steps", str(steps), "--quiet",
               "--device", "cpu", *extra]
    assert main(command) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def header(name: str) -> str:
    """The comment an example opens with, as one line of text."""
    comment = []
    for line in (EXAMPLES / name).read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# "))
    return " ".join(comment)


def test_tiny_example_does_what_its_header_says(tiny_model_dir: Path, tmp_path: Path):
    """The whole run (the model .ci/bootstrap builds is this fixture's, seed for seed): it learns
    to say "yes", and its completions still run to the length limit, as the header says."""
    records = run_example("tiny.yaml", tmp_path, {"tiny-model": tiny_model_dir}, steps=60)
    first, last = records[:5], records[-10:]
    assert mean(r["rewards/contains/mean"] for r in first) < 0.3
    assert mean(r["rewards/contains/mean"] for r in last) > 0.8
    assert mean(r["reward"] for r in last) > 0.8
    assert mean(r["completions/clipped_ratio"] for r in last) > 0.8  # it never learns to stop early
    said = header("tiny.yaml")
    assert 'the word "yes"' in said and "does not learn to stop early" in said


def test_math_example_shows_the_wiring_as_its_header_says(tiny_model_dir: Path, tmp_path: Path):
    records = run_example("math.yaml", tmp_path, {"tiny-model": tiny_model_dir}, steps=4)
    assert all(r["rewards/numeric_match/mean"] == 0.0 for r in records)
    assert mean(r["reward"] for r in records) < 0.1
    assert "shows the wiring, not learning" in header("math.yaml")


def test_math_example_trains_with_numeric_match(tiny_model_dir: Path, tmp_path: Path):
    records = run_example("math.yaml", tmp_path, {"tiny-model": tiny_model_dir})
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert 0.0 <= record["rewards/numeric_match/mean"] <= record["rewards/regex_match/mean"] <= 1.0


def test_preference_example_trains_with_a_local_reward_model(
    tiny_model_dir: Path, tiny_reward_model_dir: Path, tmp_path: Path
):
    records = run_example("preference.yaml", tmp_path,
                          {"tiny-model": tiny_model_dir, "tiny-reward-model": tiny_reward_model_dir})
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert -2.0 <= record["rewards/reward_model/mean"] <= 2.0  # clipped to [-2, 2]
        assert record["rewards/reward_model/std"] > 0  # a random classifier still tells texts apart
    # Two ranks: each loads its own copy and scores its own groups; together, what one process scored.
    ranked = run_example("preference.yaml", tmp_path, {}, "--nproc-per-node", "2", steps=1)
    for name in ("reward", "reward_std", "rewards/reward_model/mean", "rewards/reward_model/std"):
        assert ranked[0][name] == pytest.approx(records[0][name], rel=1e-4, abs=1e-6), name


@needs_sandbox
def test_tool_use_example_runs_episodes_with_its_tools(tiny_model_dir: Path, tmp_path: Path):
    """Its 60 steps take minutes (prompts of ~350 tokens: the tools' descriptions); three show the
    wiring: episodes counted in turns and calls, the model's answers rewarded. The header's rise
    (0.1 to 0.9 over 60 steps) was measured with `grpo train examples/tool_use.yaml`."""
    records = run_example("tool_use.yaml", tmp_path, {"tiny-model": tiny_model_dir}, steps=3)
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert 1.0 <= record["turns/mean"] <= record["turns/max"] <= 3.0  # at most 2 tool-calling turns
        assert 0.0 <= record["tool_errors/frequency"] <= 1.0 and record["tool_calls/mean"] >= 0.0
        assert 0.0 <= record["rewards/contains/mean"] <= 1.0
    assert "secret word" in header("tool_use.yaml")


@needs_sandbox
def test_environment_example_plays_its_game_and_learns(tiny_model_dir: Path, tmp_path: Path):
    """Its 60 steps take about a minute and a quarter on 2 cores; 12 show the environment's
    reward, multi-turn episodes and the first rise the header describes (measured with
    `grpo train examples/environment.yaml`: 0.003 at step 1, 0.33 at 25, 0.7-0.9 from 35 on)."""
    records = run_example("environment.yaml", tmp_path, {"tiny-model": tiny_model_dir}, steps=12)
    assert [r["step"] for r in records] == list(range(1, 13))
    for record in records:
        assert 1.0 <= record["turns/mean"] <= record["turns/max"] <= 3.0  # max_turns: 3
        assert record["env_reward/mean"] == pytest.approx(record["rewards/environment/mean"])
        assert record["reward"] == pytest.approx(record["env_reward/mean"])  # its only reward
    assert max(r["turns/max"] for r in records) > 1.0  # a wrong guess is answered and guessed again
    early = sum(r["reward"] for r in records[:3]) / 3
    late = sum(r["reward"] for r in records[-3:]) / 3
    assert late > early, [r["reward"] for r in records]
    assert "guess" in header("environment.yaml").lower()
