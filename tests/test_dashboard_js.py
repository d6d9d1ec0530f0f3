"""The dashboard's pure ES modules, unit-tested by Node's own runner (``node --test``, no package
installed): the tests are ``tests/dashboard_js/*.test.mjs``. Where Node is missing they skip with
the reason, except under ``.ci/run`` (GRPO_CI=1, which installs it): there that is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent / "dashboard_js"


def test_the_dashboards_js_units_pass_under_node() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("GRPO_CI") == "1":
            pytest.fail("node is missing: apt-get install -y nodejs", pytrace=False)
        pytest.skip("node is missing: apt-get install -y nodejs")
    files = sorted(str(path) for path in TESTS.glob("*.test.mjs"))
    assert files, f"no *.test.mjs under {TESTS}"
    done = subprocess.run([node, "--test", *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
