"""Values made fit for JSON, which every record of a run ends up as (a JSONL line, a JSON column,
a stream message)."""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/inf float, at any depth of dicts, lists and tuples, as None.

    JSON has no such numbers (and Postgres rejects them in JSON columns); a statistic over zero
    values is reported as null. Tuples become lists, as JSON would make them; keys become strings.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
