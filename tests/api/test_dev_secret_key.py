"""``grpo dev`` needs no setting for webhooks: its environment carries a key webhook secrets are
sealed under, made once beside the artifacts and read again by the next run of the same folder."""

from __future__ import annotations

import stat
from pathlib import Path

from api.cli.dev import dev_environment
from api.security.secret_box import SecretBox


def _environment(base: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return dev_environment(base, None, None, tmp_path / "models", tmp_path / "data")


def test_a_fresh_folder_gets_a_key_that_the_next_run_reads_again(tmp_path: Path) -> None:
    base = {"GRPO_ARTIFACTS_ROOT": str(tmp_path / "artifacts")}
    first = _environment(base, tmp_path)["GRPO_SECRET_KEY"]
    sealed = SecretBox(first).seal("whsec_abc")
    again = _environment(base, tmp_path)["GRPO_SECRET_KEY"]
    assert again == first and SecretBox(again).open(sealed) == "whsec_abc"
    key_file = tmp_path / "artifacts" / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_an_operators_key_is_kept(tmp_path: Path) -> None:
    base = {"GRPO_ARTIFACTS_ROOT": str(tmp_path / "artifacts"), "GRPO_SECRET_KEY": "given"}
    assert _environment(base, tmp_path)["GRPO_SECRET_KEY"] == "given"
    assert not (tmp_path / "artifacts" / "secret.key").exists()
