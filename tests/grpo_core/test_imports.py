"""grpo_core is a library of its own: importing all of it loads no service framework."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import grpo_core

FORBIDDEN = ("fastapi", "celery", "redis", "sqlalchemy", "starlette", "api", "worker")


def test_grpo_core_imports_no_service_framework():
    modules = [m.name for m in pkgutil.walk_packages(grpo_core.__path__, "grpo_core.")]
    assert "grpo_core.run.trainer" in modules and "grpo_core.rewards.builtins" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_spec_contract_imports_without_torch():
    """The web app validates JobSpecs without loading torch (fast start-up, small memory)."""
    code = ("import sys, grpo_core.spec.run_spec, grpo_core.spec.spec_file, grpo_core.rewards; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
