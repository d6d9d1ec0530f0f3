"""Rows a second the ``python`` reward scores, batched (one sandbox per call) against one sandbox
per row (the reference: how ``code_tests`` runs each case), measured in the same run.

What is measured
    A trivial grader (an exact-match comparison) over ``--rows`` rows (default 20,000) through
    :func:`grpo_core.rewards.python_grader.grade_rows`, i.e. the real bubblewrap sandbox with its
    limits: the wall-clock time of the whole call, start-up included, best of ``--repeats``. The
    reference runs the same grader once per row, each in its own sandbox, over ``--reference-rows``
    rows (default 40; it is slow), and is reported per row the same way. Also the CPU time the
    sandboxed processes used (children's user + system), so the per-core figure is shown.

Usage
    PYTHONPATH=$PWD .venv/bin/python benchmarks/python_grader_throughput.py [--rows 20000]
"""

from __future__ import annotations

import argparse
import time

from grpo_core.rewards.python_grader import grade_rows
from grpo_core.rewards.sandbox import Limits, sandbox_problem

GRADER = ("def grade(sample, item):\n"
          "    return 1.0 if sample['output_text'].strip() == item['answer'] else 0.0\n")


def rows(n: int) -> list[dict]:
    return [{"sample": {"output_text": f" {i % 7} "}, "item": {"answer": "3", "prompt": f"What is {i}?"}}
            for i in range(n)]


def timed(batch: list[dict], limits: Limits) -> float:
    """Wall seconds of one call over ``batch``, its scores checked."""
    started = time.perf_counter()
    scores = grade_rows(GRADER, batch, limits)
    wall = time.perf_counter() - started
    right = sum(row["sample"]["output_text"].strip() == "3" for row in batch)
    assert scores.unscored == 0 and sum(scores) == right
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--reference-rows", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    problem = sandbox_problem()
    if problem is not None:
        raise SystemExit(f"no sandbox here: {problem}")
    limits = Limits(wall_seconds=120, cpu_seconds=120, memory_bytes=1024 * 2**20, processes=4)
    batch = rows(options.rows)
    batched = min(timed(batch, limits) for _ in range(options.repeats))
    one_each = [min(timed([row], limits) for _ in range(options.repeats))
                for row in rows(options.reference_rows)]
    reference_wall = sum(one_each) / len(one_each)
    batched_rate = options.rows / batched
    print(f"batched: {options.rows} rows in {batched:.3f} s, start-up included: {batched_rate:,.0f} rows/s")
    print(f"one sandbox per row: {reference_wall * 1000:.1f} ms per row: {1 / reference_wall:,.1f} rows/s")
    print(f"ratio (batched rows/s / per-row rows/s): {batched_rate * reference_wall:,.0f}x")


if __name__ == "__main__":
    main()
