"""``hf:`` models load by hub id only: an id that names a local folder is refused before
transformers could read it, and a hub that cannot be reached (offline, nothing cached) is
``source_unavailable``, not the spec's fault."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.io.hub_loading import is_hub_location, split_revision
from grpo_core.io.model_loading import load_causal_lm, load_tokenizer


def test_a_hub_id_naming_a_local_model_folder_is_refused(tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(tiny_model_dir, tmp_path / "outside" / "m")
    monkeypatch.chdir(tmp_path)
    cpu = torch.device("cpu")
    for load in (lambda: load_tokenizer("outside/m"), lambda: load_causal_lm("outside/m", "float32", cpu)):
        with pytest.raises(SpecError) as info:
            load()
        assert info.value.field == "model.source" and "a local path of that name exists" in info.value.reason
    assert load_tokenizer(str(tmp_path / "outside" / "m")) is not None  # the same folder as a path: is fine


def test_an_unreachable_hub_is_source_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceUnavailable) as info:
        load_tokenizer("nobody/absent-model@main")
    assert info.value.code == "source_unavailable"
    assert info.value.field == "model.source"
    assert "'nobody/absent-model@main': the source cannot be reached" in info.value.reason


def test_locations_are_hub_ids_unless_absolute() -> None:
    assert split_revision("owner/name@v1") == ("owner/name", "v1")
    assert split_revision("/models/m@weird") == ("/models/m@weird", None)  # a folder's name is its own
    assert is_hub_location("owner/name") and not is_hub_location("/srv/models/tiny")
