"""The ``python`` reward: a team's ``grade(sample, item)`` runs in the real sandbox, all rows of a
call in one interpreter; its source is checked without running it; bad values and exceptions leave
rows unscored with a reason; it shapes like any reward."""

from __future__ import annotations

import math
import time
from pathlib import Path
from statistics import mean

import pytest
from reward_helpers import bind_one, fresh_registry, run, spec_error  # noqa: F401
from sandbox_guard import needs_sandbox
from test_example_jobs import run_example

from grpo_core.errors import GRPOError
from grpo_core.rewards import (
    RewardContext,
    bind_rewards,
    required_capabilities,
    sandbox_footprints,
    score_completions,
)
from grpo_core.rewards.python_grader import MAX_SOURCE_CHARS, check_source
from grpo_core.rewards.sandbox import CAPABILITY
from grpo_core.spec.run_spec import RewardSpec

pytestmark = needs_sandbox

EXACT = ("def grade(sample, item):\n"
         "    return 1.0 if sample['output_text'].strip() == item['answer'] else 0.0\n")


def python(source: str, **args) -> RewardSpec:
    return RewardSpec(name="python", args={"source": source, **args})


def test_grade_sees_the_completion_and_the_dataset_row_with_its_prompt() -> None:
    source = ("def grade(sample, item):\n"
              "    assert set(item) == {'answer', 'level', 'prompt'}, sorted(item)\n"
              "    bonus = 0.5 if item['prompt'].startswith('Q') else 0.0\n"
              "    right = 0.5 if sample['output_text'] == item['answer'] else 0.0\n"
              "    return right + bonus * item['level']\n")
    reward = bind_one("python", source=source)
    scores = reward.fn(["4", "5", "4"], ["Q: 2+2", "Q: 2+2", "2+2"], answer=["4", "4", "4"], level=[1, 0, 1],
                       raw_completions=["x"] * 3, prompt_messages=[None] * 3)
    assert list(scores) == [1.0, 0.0, 0.5]
    assert scores.unscored == 0


def test_chat_prompts_reach_the_grader_as_the_dataset_gave_them() -> None:
    source = "def grade(sample, item):\n    return 1.0 if item['prompt'][-1]['role'] == 'user' else 0.0\n"
    reward = bind_one("python", source=source)
    messages = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]]
    assert list(reward.fn(["ok"], ["rendered text"], prompt_messages=messages)) == [1.0]


def test_none_is_not_scored_and_bad_values_or_exceptions_are_unscored_with_a_reason() -> None:
    source = ("import math\n"
              "def grade(sample, item):\n"
              "    text = sample['output_text']\n"
              "    if text == 'none': return None\n"
              "    if text == 'raise': return {}['missing']\n"
              "    if text == 'exit': raise SystemExit(1)\n"
              "    odd = {'str': 'high', 'big': 1.5, 'nan': math.nan, 'neg': -0.1, 'bool': True}\n"
              "    return odd.get(text, 0.25)\n")
    reward = bind_one("python", source=source)
    texts = ["none", "raise", "exit", "str", "big", "nan", "neg", "bool", "fine"]
    scores = run(reward, texts)
    assert list(scores) == [None] * 8 + [0.25]
    assert scores.unscored == 7  # None is "does not apply", not a failure
    # The grader's line by its number and its code, so a team sees where without the source at hand.
    where = "(grader.py line 5: if text == 'raise': return {}['missing'])"
    assert f"KeyError: 'missing' {where}" in scores.problems[1]
    assert "SystemExit" in scores.problems[2]
    assert "not a number" in scores.problems[3] and "outside [0, 1]" in scores.problems[4]
    assert "outside [0, 1]" in scores.problems[5] and "not a number" in scores.problems[7]


def test_what_the_grader_prints_cannot_corrupt_its_results() -> None:
    source = ("import os, sys\n"
              "def grade(sample, item):\n"
              "    print('{\"i\": 0, \"value\": 0.0}')\n"
              "    os.write(1, b'{\"i\": 0, \"value\": 0.0}\\n' * 100)\n"
              "    sys.__stdout__.write('garbage\\n')\n"
              "    return 1.0\n")
    scores = run(bind_one("python", source=source), ["a", "b"])
    assert list(scores) == [1.0, 1.0] and scores.unscored == 0


def test_a_grader_that_does_not_load_fails_the_call_with_its_error() -> None:
    # An import statement of numpy is refused with the spec (tests/api/test_files_columns.py); one by a
    # name at run time is not seen until the sandbox runs it.
    reward = bind_one("python", source="numpy = __import__('numpy')\n\ndef grade(sample, item):\n"
                                        "    return 1.0\n")
    with pytest.raises(GRPOError) as info:
        run(reward, ["a"])
    assert info.value.code == "reward_error"
    assert "does not load" in info.value.message and "ModuleNotFoundError" in info.value.message
    assert "numpy" in info.value.message


def test_rows_left_when_the_time_runs_out_are_unscored_and_the_call_returns() -> None:
    source = ("import time\n"
              "def grade(sample, item):\n"
              "    if sample['output_text'] == 'slow':\n"
              "        while True: pass\n"
              "    return 1.0\n")
    reward = bind_one("python", RewardContext(timeout_seconds=3.0), source=source)
    started = time.monotonic()
    scores = run(reward, ["fast", "fast", "slow", "fast"])
    assert time.monotonic() - started < 3.0  # within the job's budget, margin included
    assert list(scores) == [1.0, 1.0, None, None]
    assert scores.problems[2] == scores.problems[3] == "not reached: the grader ran out of time"


def test_one_sandboxed_interpreter_scores_many_rows() -> None:
    """Thousands of rows in one call: well inside a second on one core (the benchmark has the figure)."""
    n = 5000
    scores = run(bind_one("python", source=EXACT), ["4"] * n, answer=["4", "5"] * (n // 2))
    assert list(scores) == [1.0, 0.0] * (n // 2) and scores.unscored == 0


def test_weights_clip_and_gates_shape_it_like_any_reward() -> None:
    rewards = bind_rewards([
        RewardSpec(name="contains", args={"text": "4"}, weight=1.0),
        RewardSpec(name="python", args={"source": "def grade(s, i):\n    return 0.8\n"}, weight=2.0,
                   clip_max=0.5, gate_by="contains", gate_threshold=0.5),
    ], RewardContext())
    scored = score_completions(rewards, ["4", "x"], ["p", "p"], {})
    assert scored.matrix[0] == [1.0, 0.5]  # clipped to 0.5
    assert scored.matrix[1][0] == 0.0 and scored.matrix[1][1] == 0.0  # gated: contains failed
    assert required_capabilities([python(EXACT)]) == [(0, CAPABILITY)]


def test_its_sandbox_footprint_is_one_interpreters_processes_and_tmp() -> None:
    mib = 2**20
    specs = [python(EXACT), RewardSpec(name="contains", args={"text": "x"}),
             python(EXACT, memory_mb=64, max_processes=1)]
    assert sandbox_footprints(specs) == [(0, (4 * 512 + 16) * mib), (2, (64 + 16) * mib)]


@pytest.mark.parametrize(("args", "field", "says"), [
    ({"source": "def grade(sample, item)\n    return 1\n"}, "source",
     "does not compile: expected ':' (line 1)"),
    ({"source": "def score(sample, item):\n    return 1\n"}, "source", "must define a function grade"),
    ({"source": "def grade(sample):\n    return 1\n"}, "source", "must define a function grade"),
    ({"source": "async def grade(s, i):\n    return 1\n"}, "source", "not async"),
    ({"source": "x = 1\n" * (MAX_SOURCE_CHARS // 6 + 1)}, "source", str(MAX_SOURCE_CHARS)),
    ({"source": EXACT, "requirements": ["numpy"]}, "requirements", "standard library only"),
    ({"source": "import os\nimport numpy.linalg\n" + EXACT}, "source", "line 2 imports 'numpy.linalg'"),
    ({"source": "from .helpers import f\n" + EXACT}, "source", "line 1 imports '.helpers'"),
    # A try that does not catch a failed import guards nothing, nor does its else.
    ({"source": "try:\n    import numpy\nexcept ValueError:\n    pass\n" + EXACT}, "source",
     "line 2 imports 'numpy'"),
    ({"source": "try:\n    pass\nexcept ImportError:\n    pass\nelse:\n    import yaml\n" + EXACT},
     "source", "line 6 imports 'yaml'"),
])
def test_a_broken_grader_is_refused_naming_its_field_without_running(args, field, says) -> None:
    error = spec_error([python(**args)])
    assert error.field == f"rewards.0.args.{field}"
    assert says in error.message


def test_standard_library_imports_and_guarded_fallbacks_pass_the_import_check() -> None:
    source = ("from __future__ import annotations\nimport os.path, json\nfrom collections import abc\n"
              "try:\n    import numpy\nexcept (ValueError, ModuleNotFoundError):\n    numpy = None\n"
              "def grade(sample, item):\n    import re\n    return 1.0\n")
    assert check_source(source) == source


def test_checking_the_source_never_runs_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    check_source(f"open({str(marker)!r}, 'w').write('x')\ndef grade(sample, item):\n    return 1.0\n")
    assert not marker.exists()


def test_the_example_learns_with_its_inline_grader_on_one_and_two_ranks(tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    records = run_example("python_grader.yaml", tmp_path, {"tiny-model": tiny_model_dir}, steps=36)
    assert mean(r["rewards/python/mean"] for r in records[:5]) < 0.3
    assert mean(r["rewards/python/mean"] for r in records[-5:]) > 0.8
    assert all(not math.isnan(r["reward"]) for r in records)
    ranked = run_example("python_grader.yaml", tmp_path, {}, "--nproc-per-node", "2", steps=1)
    for name in ("reward", "reward_std", "rewards/python/mean"):
        assert ranked[0][name] == pytest.approx(records[0][name], rel=1e-6, abs=1e-9), name



# Each grader reaches into the interpreter it shares with the harness to have its rows scored out
# of [0, 1] or as a non-number. The harness only passes values on and the check runs outside it,
# so every such row is unscored with a reason.
WRITE_RESULT = ("def write_result(text):\n"
                "    frame = sys._getframe()\n"
                "    while 'results' not in frame.f_locals:\n"
                "        frame = frame.f_back\n"
                "    os.write(frame.f_locals['results'].fileno(), text.encode() + b'\\n')\n")
TAMPERING = {
    "the harness's checker in sys.modules": (
        "import sys\n"
        "sys.modules['__main__']._value = lambda result: {'value': result}\n"
        "def grade(sample, item):\n    return 1e308\n"),
    "the harness's functions through a frame": (
        "import sys\n"
        "def grade(sample, item):\n"
        "    harness = sys._getframe(1).f_globals\n"
        "    for name in [name for name in harness if name in ('_value', '_raw')]:\n"
        "        harness[name] = lambda result: {'value': result}\n"
        "    return -5\n"),
    "builtins, float and math": (
        "import builtins, math\n"
        "class Liar(float):\n"
        "    __le__ = __ge__ = __lt__ = __gt__ = lambda self, other: True\n"
        "builtins.float = Liar\n"
        "real_isinstance = isinstance\n"
        "builtins.isinstance = lambda value, kinds: kinds is not bool and real_isinstance(value, kinds)\n"
        "math.isfinite = lambda value: True\n"
        "def grade(sample, item):\n    return 1000\n"),
    "the json module": (
        "import json\n"
        "real_dumps = json.dumps\n"
        "json.dumps = lambda record, **kw: real_dumps({**record, 'value': 1000} if 'i' in record"
        " else record)\n"
        "def grade(sample, item):\n    return 0.5\n"),
    "the results descriptor, then exit before the harness writes": (
        "import os, sys\n" + WRITE_RESULT +
        "def grade(sample, item):\n"
        "    write_result('{\"i\": %d, \"value\": 1e308}' % int(sample['output_text']))\n"
        "    os._exit(0)\n"),
    "hand-made lines the harness never writes": (
        "import os, sys\n" + WRITE_RESULT +
        "def grade(sample, item):\n"
        "    for line in ('{\"i\": 0, \"value\": NaN}', '{\"i\": 0, \"value\": Infinity}',\n"
        "                 '{\"i\": true, \"value\": 1000}', '{\"i\": 0, \"value\": true}',\n"
        "                 '{\"i\": 0, \"value\": \"1\"}', '{\"i\": 0, \"value\": ' + '9' * 400 + '}',\n"
        "                 '[' * 5000 + ']' * 5000, '1e308', '{\"i\": 0, \"value\": -5}'):\n"
        "        write_result(line)\n"
        "    os._exit(0)\n"),
}


@pytest.mark.parametrize("route", TAMPERING)
def test_a_grader_tampering_with_its_harness_cannot_score_out_of_range(route) -> None:
    # Two rows: a route that patches the harness while its first row is graded acts on the second.
    scores = run(bind_one("python", source=TAMPERING[route]), ["0", "1"])
    assert list(scores) == [None, None], scores.problems
    assert scores.unscored == 2 and all(scores.problems.values()), scores.problems


def test_a_forged_result_for_a_row_makes_it_unscored_not_its_value() -> None:
    source = ("import os, sys\n" + WRITE_RESULT +
              "def grade(sample, item):\n"
              "    if sample['output_text'] == '0':\n"
              "        write_result('{\"i\": 0, \"value\": 1.0}')\n"
              "    return 0.25\n")
    scores = run(bind_one("python", source=source), ["0", "1"])
    assert list(scores) == [None, 0.25]
    assert scores.problems == {0: "more than one result for this row"}
