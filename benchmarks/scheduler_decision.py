"""Time of one scheduling decision: ``api.scheduling.policy.plan()`` on seeded synthetic cluster states.

Usage:
    .venv/bin/python benchmarks/scheduler_decision.py [--sizes 1000,10000] [--repeats 20]
        [--reference-up-to 1000] [--reference-repeats 3] [--seed 0]

For each size it builds one state (``reference_policy.random_state``, no edge cases): that many
waiting jobs across 50 teams (weights 0.5-4, ~30% of team/pool pairs with a quota, priorities
high/normal/low alike, jobs mostly of 1 GPU, some 2 or 4), 64 workers of 1-8 GPUs in 2 pools,
about half of them busy with held jobs (some already asked to yield). It times ``plan()`` with
``time.perf_counter`` (one warm-up call, then ``--repeats`` calls: median and p95) against the
200 ms target of one scheduler tick. For sizes up to ``--reference-up-to`` it also times the naive
O(N^2 log N) reference and checks that both give the same plan (dispatches, reasons, positions,
preemptions). Only the pure decision is timed: the SQL reads and writes of a real tick are not.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table, median  # noqa: E402
from reference_policy import random_state, reference_plan  # noqa: E402

from api.domain.cluster_state import ClusterState  # noqa: E402
from api.scheduling.policy import Plan, plan  # noqa: E402

TARGET_MS = 200.0
TEAMS = 50
WORKERS = 64


def build_state(jobs: int, seed: int) -> ClusterState:
    return random_state(random.Random(seed * 1_000_003 + jobs), jobs, TEAMS, WORKERS, edge_cases=False)


def time_ms(decide: Callable[[ClusterState], Plan], state: ClusterState, repeats: int) -> list[float]:
    decide(state)  # warm-up: first-call costs (imports, allocator growth) are not a tick's
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        decide(state)
        times.append((time.perf_counter() - start) * 1000)
    return times


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank


def same_plan(a: Plan, b: Plan) -> bool:
    return (a.dispatch, a.pending, a.position, a.preempt) == (b.dispatch, b.pending, b.position, b.preempt)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--sizes", default="1000,10000", help="comma-separated waiting-job counts")
    add("--repeats", type=int, default=20, help="timed plan() calls per size")
    add("--reference-up-to", type=int, default=1000, help="largest size the reference runs on")
    add("--reference-repeats", type=int, default=3, help="timed reference calls per size")
    add("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"Python {platform.python_version()}, {os.cpu_count()} CPU(s), {platform.machine()}")
    print(f"{TEAMS} teams, {WORKERS} workers in 2 pools; {args.repeats} timed plan() calls per size "
          f"after 1 warm-up; target {TARGET_MS:.0f} ms per decision\n")
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        state = build_state(size, args.seed)
        fast = time_ms(plan, state, args.repeats)
        result = plan(state)
        ref_ms, speedup, agree = float("nan"), float("nan"), "-"
        if size <= args.reference_up_to:
            ref_ms = median(time_ms(reference_plan, state, args.reference_repeats))
            speedup = ref_ms / median(fast)
            agree = "yes" if same_plan(result, reference_plan(state)) else "NO"
        counts = [size, len(state.holding), len(result.dispatch), len(result.preempt)]
        rows.append([*counts, median(fast), p95(fast), TARGET_MS / median(fast), ref_ms, speedup, agree])
    print(format_table(["waiting jobs", "holding", "dispatched", "preempted", "plan median ms", "p95 ms",
                        "target/median", "reference ms", "speed-up", "same plan"], rows))
    if any(row[-1] == "NO" for row in rows):
        sys.exit("plan() and the reference disagree")


if __name__ == "__main__":
    main()
