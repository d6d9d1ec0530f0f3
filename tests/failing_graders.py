"""Python graders that fail, with the rows they fail on, for the tests that follow a grader's
failures through the worker (``tests/worker/test_reward_failures.py``) and onto the dashboard
(``tests/e2e/test_dashboard_rewards.py``)."""

from __future__ import annotations

ROWS = [{"prompt": "Say yes.", "answer": "yes"}, {"prompt": "Say no.", "answer": "no"}]
# Raises on every row, on its line 2.
ALWAYS = "def grade(sample, item):\n    return 1.0 / len(item['no_such_key'])\n"
# Raises on the "no" row's completions (half of each step's rows), on its line 3.
SOMETIMES = ("def grade(sample, item):\n"
             "    if item['answer'] == 'no':\n"
             "        raise ValueError('cannot grade a no')\n"
             "    return 1.0\n")
