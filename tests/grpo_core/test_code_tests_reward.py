"""``code_tests``: the completion's fenced Python runs against the row's test cases in the real
sandbox; the score is the fraction passed. Also its args, the shape of its column, its budget,
and what happens where no sandbox can run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from reward_helpers import bind_one, fresh_registry, run, spec_error  # noqa: F401
from sandbox_guard import needs_sandbox

from grpo_core.cli import main
from grpo_core.errors import SpecError
from grpo_core.rewards import (
    RewardContext,
    check_reward_rows,
    required_capabilities,
    sandbox_footprints,
    score_completions,
)
from grpo_core.rewards.code_tests import extract_code
from grpo_core.rewards.sandbox import SandboxUnavailable, sandbox_problem
from grpo_core.spec.run_spec import RewardSpec

pytestmark = needs_sandbox

DOUBLE = [{"input": "2\n", "output": "4\n"}, {"input": "5", "output": "10"}, {"input": "-1", "output": "-2"}]
ADD = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my answer.\n```{lang}\n{code}\n```\nDone."


def test_correct_partial_wrong_and_missing_code_score_their_fraction() -> None:
    reward = bind_one("code_tests")
    completions = [
        fenced("print(int(input()) * 2)"),  # all three
        fenced("n = int(input())\nprint(n * 2 if n > 0 else 0)"),  # the two positive inputs
        fenced("print(int(input()) + 2)"),  # only 2 -> 4
        fenced("print('nope')"),
        "I would multiply by two.",  # no code block
        fenced("raise SystemExit(3)"),
    ]
    scores = run(reward, completions, tests=[DOUBLE] * len(completions))
    assert scores == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3), 0.0, 0.0, 0.0]


def test_assert_cases_run_after_the_code_and_json_text_columns_are_read() -> None:
    reward = bind_one("code_tests", field="checks")
    right, half_right = "def add(a, b):\n    return a + b", "def add(a, b):\n    return abs(a) + b"
    completions = [fenced(right), fenced(half_right, "py"), fenced(right, "")]
    scores = run(reward, completions, checks=[ADD, json.dumps(ADD), ADD])
    assert scores == [1.0, 0.5, 1.0]


def test_output_comparison_ignores_trailing_whitespace_only() -> None:
    reward = bind_one("code_tests")
    cases = [[{"input": "", "output": "a\nb\n"}]] * 4
    completions = [fenced("print('a  ')\nprint('b')\nprint()"), fenced("print('a\\r\\nb')"),
                   fenced("print(' a')\nprint('b')"), fenced("print('a')")]
    assert run(reward, completions, tests=cases) == [1.0, 1.0, 0.0, 0.0]


def test_the_last_block_runs_unless_first_is_asked() -> None:
    text = fenced("print(0)") + "\nBetter:\n" + fenced("print(int(input()) * 2)") + "\n```text\nnot code\n```"
    assert extract_code(text) == "print(int(input()) * 2)\n"
    assert extract_code(text, "first") == "print(0)\n"
    assert extract_code("```bash\nls\n```") is None
    assert run(bind_one("code_tests"), [text], tests=[DOUBLE]) == [1.0]
    assert run(bind_one("code_tests", block="first"), [text], tests=[DOUBLE]) == [0.0]


def test_a_null_tests_value_leaves_the_row_unscored_and_a_malformed_one_names_column_and_row() -> None:
    reward = bind_one("code_tests")
    assert run(reward, [fenced("print(1)")], tests=[None]) == [None]
    for bad, why in [([], "1 to 64"), ("not json", "JSON list"), ([{"input": "1"}], "case 0"),
                     ([{"input": 1, "output": "1"}], "case 0"), ([{"output": "1", "x": 2}], "case 0"),
                     ([3], "case 0"), ([{"output": "1"}] * 65, "1 to 64")]:
        with pytest.raises(ValueError, match=rf"column 'tests' row 1: .*{why}"):
            run(reward, [fenced("print(1)")] * 2, tests=[DOUBLE, bad])


def test_bad_args_name_the_field() -> None:
    for args, field in [({"timeout_seconds": 0}, "timeout_seconds"), ({"memory_mb": 10**6}, "memory_mb"),
                        ({"block": "middle"}, "block"), ({"parallel": 0}, "parallel"), ({"nope": 1}, "nope")]:
        error = spec_error([RewardSpec(name="code_tests", args=args)])
        assert error.field == f"rewards.0.args.{field}", error
    assert spec_error([RewardSpec(name="code_tests")], columns={"prompt"}).field == "rewards.0.args"


def test_it_needs_the_code_sandbox_capability() -> None:
    specs = [RewardSpec(name="contains", args={"text": "x"}), RewardSpec(name="code_tests"),
             RewardSpec(name="no_such_reward")]
    assert required_capabilities(specs) == [(1, "code_sandbox")]


def test_its_sandbox_footprint_is_parallel_runs_each_with_all_its_processes_and_tmp() -> None:
    mib = 2**20
    specs = [RewardSpec(name="contains", args={"text": "x"}), RewardSpec(name="code_tests"),
             RewardSpec(name="code_tests", args={"parallel": 16, "max_processes": 2, "memory_mb": 64}),
             RewardSpec(name="code_tests", args={"parallel": 0})]  # invalid: validation reports it
    assert sandbox_footprints(specs) == [(1, 4 * (8 * 256 + 16) * mib), (2, 16 * (2 * 64 + 16) * mib)]


def test_a_batch_of_32_completions_runs_within_the_budget_and_a_slow_one_times_out_alone() -> None:
    # A case's own limit (5 s) is far above a sandbox's start on a loaded CI host (1 s was not:
    # once a correct program's case timed out there); the loop alone reaches it.
    reward = bind_one("code_tests", RewardContext(timeout_seconds=60), timeout_seconds=5.0)
    completions = [fenced("print(int(input()) * 2)")] * 31 + [fenced("while True:\n    pass")]
    started = time.monotonic()
    scores = run(reward, completions, tests=[DOUBLE] * 32)
    assert time.monotonic() - started < 60
    assert scores == [1.0] * 31 + [0.0]


def test_a_spent_budget_leaves_the_rest_unscored_and_returns_in_time() -> None:
    [reward] = [bind_one("code_tests", RewardContext(timeout_seconds=2.0), timeout_seconds=10)]
    # Each program would run 30 s: back well before that means the 2 s budget cut them off. The
    # bound leaves the sandbox's start and teardown room on a loaded machine (it was 4 s, which a
    # busy CI host overran).
    slow = fenced("import time\ntime.sleep(30)\nprint(int(input()) * 2)")
    started = time.monotonic()
    scores = score_completions([reward], [slow] * 3, [""] * 3, {"tests": [DOUBLE] * 3})
    assert time.monotonic() - started < 10
    assert all(math.isnan(row[0]) for row in scores.matrix) and scores.timed_out == []


def test_without_bwrap_the_reward_refuses_to_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox_problem.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bwrap") as info:
            bind_one("code_tests")
        assert info.value.code == "sandbox_unavailable"
    finally:
        monkeypatch.undo()
        sandbox_problem.cache_clear()


def test_grpo_train_refuses_to_start_without_a_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    repo = Path(__file__).resolve().parents[2]
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "code", "model": {"source": f"path:{repo / 'examples' / 'tiny-model'}", "dtype": "float32"},
        "dataset": {"prompts": [{"prompt": "double it", "tests": DOUBLE}]},
        "rewards": [{"name": "code_tests"}],
        "grpo": {"num_generations": 2, "prompts_per_step": 1, "max_completion_length": 4, "max_steps": 1}}))
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox_problem.cache_clear()
    try:
        code = main(["train", str(spec), "--output-dir", str(tmp_path / "out"), "--device", "cpu", "--quiet"])
    finally:
        monkeypatch.undo()
        sandbox_problem.cache_clear()
    assert code == 1
    stderr = capsys.readouterr().err
    assert "sandbox_unavailable" in stderr and "bwrap" in stderr, stderr
    assert not (tmp_path / "out" / "final").exists()


def test_the_code_example_trains_on_cpu_with_the_tiny_model(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "code.yaml"
    out = tmp_path / "out"
    assert main(["train", str(example), "--output-dir", str(out), "--max-steps", "1", "--device", "cpu",
                 "--quiet"]) == 0
    [record] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 0.0 <= record["rewards/code_tests/mean"] <= 1.0  # ~0: a random model writes no code


def test_malformed_test_cases_in_the_rows_are_refused_before_training() -> None:
    specs = [RewardSpec(name="contains", args={"text": "x"}),
             RewardSpec(name="code_tests", args={"field": "t"})]
    check_reward_rows(specs, [{"prompt": "a", "t": DOUBLE}, {"prompt": "b", "t": json.dumps(ADD)}])
    with pytest.raises(SpecError, match=r"rewards\.1\.args: column 't' row 1: case 0") as info:
        check_reward_rows(specs, [{"prompt": "a", "t": DOUBLE}, {"prompt": "b", "t": [{"in": "1"}]}])
    assert info.value.field == "rewards.1.args"
