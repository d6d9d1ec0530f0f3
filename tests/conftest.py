"""Fixtures shared by every test package: tiny local models, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init Llama-family model + tokenizer folder (no network)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), family="llama")


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory):
    """``factory(family) -> folder``, cached per family."""
    built: dict[str, Path] = {}

    def factory(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), family=family)
        return built[family]

    return factory
