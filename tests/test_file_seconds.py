"""The recorded seconds per test file that order xdist's hand-out (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import file_seconds


def test_a_durations_report_sums_setup_call_and_teardown_per_file_and_drops_short_files():
    report = [
        "============================ slowest durations =============================",
        "12.50s call     tests/worker/test_a.py::test_one[postgres]",
        "3.30s setup    tests/worker/test_a.py::test_one[postgres]",
        "0.40s teardown tests/worker/test_a.py::test_two",
        "20.00s call     tests/e2e/test_b.py::test_three",
        "0.90s call     tests/api/test_c.py::test_quick",
        "(12 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    assert file_seconds.file_seconds(report) == {"tests/e2e/test_b.py": 20.0, "tests/worker/test_a.py": 16.2}


def test_every_recorded_file_exists_so_a_moved_file_is_noticed():
    root = Path(__file__).parent.parent
    missing = [name for name in file_seconds.recorded() if not (root / name).is_file()]
    assert not missing, f"tests/file_seconds.json names files that are gone (refresh it): {missing}"
