"""Reading a run's JSONL records and comparing two runs' records, for the multi-rank tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

# Wall-clock figures differ from run to run; everything else must not.
UNEQUAL = ("timing/", "step_time", "tokens_per_second", "peak_memory_mb")


def records(out: Path, name: str) -> list[dict]:
    """``out/{name}.jsonl`` (metrics, samples or events), one dict per line."""
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


def assert_close_records(one: dict, two: dict, where: str) -> None:
    """Same keys; floats within 1e-5, everything else equal, wall-clock figures aside."""
    assert one.keys() == two.keys(), where
    for key, value in one.items():
        if key.startswith(UNEQUAL):
            continue
        if isinstance(value, float) and isinstance(two[key], float):
            close = math.isclose(value, two[key], rel_tol=1e-5, abs_tol=1e-5)
            assert close, f"{where} {key}: {value} != {two[key]}"
        else:
            assert value == two[key], f"{where} {key}"
