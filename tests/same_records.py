"""Comparing two runs of one job record by record (metrics, samples): every value equal, floats
within 1e-5, except the wall-clock figures, which differ from run to run. Used wherever a run on
k ranks must equal the 1-process run (``grpo train`` and the service's worker).
"""

from __future__ import annotations

import math
from typing import Any

WALL_CLOCK = ("timing/", "step_time", "tokens_per_second", "peak_memory_mb")


def assert_same_record(one: dict[str, Any], two: dict[str, Any], where: str) -> None:
    assert one.keys() == two.keys(), where
    for key, value in one.items():
        if key.startswith(WALL_CLOCK):
            continue
        if isinstance(value, float) and isinstance(two[key], float):
            close = math.isclose(value, two[key], rel_tol=1e-5, abs_tol=1e-5)
            assert close, f"{where} {key}: {value} != {two[key]}"
        else:
            assert value == two[key], f"{where} {key}"
