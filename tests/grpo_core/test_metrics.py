"""Metric records are JSON: non-finite numbers become null at any depth."""

from __future__ import annotations

import json
import math

from grpo_core.json_values import json_safe


def test_json_safe_nulls_non_finite_floats_at_every_depth():
    value = {
        "nan": math.nan,
        "inf": math.inf,
        "ok": 1.5,
        "int": 3,
        "text": "nan",
        "nested": {"row": [1.0, -math.inf, (math.nan, 2.0)], 7: None},
    }
    assert json_safe(value) == {
        "nan": None,
        "inf": None,
        "ok": 1.5,
        "int": 3,
        "text": "nan",
        "nested": {"row": [1.0, None, [None, 2.0]], "7": None},
    }
    json.dumps(json_safe(value), allow_nan=False)  # strict JSON accepts it
