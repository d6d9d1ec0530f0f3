"""``grpo dev`` writes only under its artifacts folder: the worker's cache of uploaded files
(``GRPO_WORKER_CACHE_DIR``) is there too, not a ``worker-cache/`` in the folder it was started from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api.cli.dev import dev_environment
from api.settings import Settings


def test_the_worker_cache_the_children_read_lies_under_the_artifacts_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = dev_environment({"GRPO_ARTIFACTS_ROOT": str(tmp_path / "artifacts")}, None, None,
                          tmp_path / "models", tmp_path / "data")
    for name in [n for n in os.environ if n.startswith("GRPO_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("GRPO_"):
            monkeypatch.setenv(name, value)
    settings = Settings()  # as the worker `grpo dev` starts reads its environment
    cache = Path(settings.worker_cache_dir).resolve()
    assert cache.is_relative_to((tmp_path / "artifacts").resolve()), cache


def test_an_operators_cache_folder_is_kept(tmp_path: Path) -> None:
    base = {"GRPO_ARTIFACTS_ROOT": str(tmp_path / "artifacts"),
            "GRPO_WORKER_CACHE_DIR": str(tmp_path / "cache")}
    env = dev_environment(base, None, None, tmp_path / "models", tmp_path / "data")
    assert env["GRPO_WORKER_CACHE_DIR"] == str(tmp_path / "cache")
