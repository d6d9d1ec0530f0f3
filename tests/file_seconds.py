"""Seconds each test file took in a recorded run (``tests/file_seconds.json``), for the order in
which xdist hands files out (tests/conftest.py). Refresh it after tests move or grow:

    .venv/bin/python -m pytest --durations=0 | .venv/bin/python tests/file_seconds.py

reads pytest's durations report on stdin and rewrites the JSON (files under a second left out)."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

RECORD = Path(__file__).with_name("file_seconds.json")
# "12.34s call     tests/worker/test_x.py::test_y[param]"
_LINE = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s\s+(?:setup|call|teardown)\s+(?P<file>[^:\s]+)::")


def recorded() -> dict[str, float]:
    """File path (from the repository root) -> seconds; empty when nothing is recorded."""
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def file_seconds(report_lines: list[str]) -> dict[str, float]:
    """Seconds per file summed over a durations report's setup, call and teardown lines."""
    seconds: dict[str, float] = defaultdict(float)
    for line in report_lines:
        if match := _LINE.match(line.strip()):
            seconds[match["file"]] += float(match["seconds"])
    return {name: round(total, 1) for name, total in sorted(seconds.items(), key=lambda kv: -kv[1])
            if total >= 1.0}


if __name__ == "__main__":
    totals = file_seconds(sys.stdin.read().splitlines())
    if not totals:
        sys.exit("no durations report on stdin: run pytest with --durations=0")
    RECORD.write_text(json.dumps(totals, indent=1) + "\n")
    print(f"{RECORD}: {len(totals)} files, {sum(totals.values()):.0f} s in all")
