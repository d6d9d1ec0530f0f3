"""The one skip rule for tests that need the bubblewrap sandbox (``grpo_core.rewards.sandbox``): on a
machine without a usable one they are skipped, saying why, except in CI (``GRPO_CI`` set, as
``.ci/run`` sets it), where the sandbox is installed and a test that cannot use it must fail, not
vanish from the results. ``tests/test_sandbox_guard.py`` checks that every sandbox test uses it."""

from __future__ import annotations

import os

import pytest

from grpo_core.rewards.sandbox import sandbox_problem

needs_sandbox = pytest.mark.skipif(
    sandbox_problem() is not None and not os.environ.get("GRPO_CI"),
    reason=f"no usable sandbox here: {sandbox_problem()}",
)
