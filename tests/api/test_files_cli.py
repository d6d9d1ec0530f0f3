"""``grpo files upload|list|show|rm`` through ``api.cli.main.main`` against the module's real
server: a model folder packed on the fly, a dataset file, the API's refusals as exit code 2."""

from __future__ import annotations

import io
import tarfile

import pytest
from test_files import ROWS, TINY_MODEL
from test_monitor_cli import Grpo


@pytest.fixture
def grpo(capsys, api_server, team_keys) -> Grpo:
    return Grpo(capsys, api_server.http_url, team_keys.alpha)


def test_upload_list_show_and_remove(grpo, alpha, tmp_path) -> None:
    model = grpo.json("files", "upload", str(TINY_MODEL), "--purpose", "model")
    assert (model["purpose"], model["filename"], model["status"]) == ("model", "tiny-model.tar.gz", "ready")
    packed = alpha.get(f"/v1/files/{model['id']}/content").content
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:  # the folder's files, at the root
        assert sorted(archive.getnames()) == sorted(path.name for path in TINY_MODEL.iterdir())

    (tmp_path / "rows.jsonl").write_bytes(ROWS)
    code, out, err = grpo("files", "upload", str(tmp_path / "rows.jsonl"), "--purpose", "dataset")
    assert code == 0 and err == "", err
    dataset_id = out.split()[1]
    assert f"use as:    file:{dataset_id}" in out

    code, out, _ = grpo("files", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "PURPOSE", "STATUS", "BYTES", "CREATED", "FILENAME"]
    assert lines[1].split()[:3] == [dataset_id, "dataset", "ready"] and lines[2].split()[0] == model["id"]
    assert grpo.json("files", "show", dataset_id) == alpha.get(f"/v1/files/{dataset_id}").json()

    for file_id in (dataset_id, model["id"]):
        code, out, _ = grpo("files", "rm", file_id)
        assert code == 0 and out.startswith(f"deleted {file_id}")
    assert dataset_id not in grpo("files", "list")[1]


def test_refusals_are_bad_input(grpo, tmp_path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"question": "no prompt"}\n')
    code, _, err = grpo("files", "upload", str(tmp_path / "rows.jsonl"), "--purpose", "dataset")
    assert code == 2 and "row 0 has no 'prompt' column" in err
    code, out, err = grpo("files", "upload", str(tmp_path / "rows.jsonl"), "--purpose", "dataset",
                          "--prompt-field", "question")
    assert code == 0 and "ready" in out, err
    # Remembered with the file, for the specs that name it.
    assert "prompt:    question" in out.splitlines() and "columns:   question" in out.splitlines()
    code, _, err = grpo("files", "upload", str(tmp_path / "missing.jsonl"), "--purpose", "dataset")
    assert code == 2 and "no such file or folder" in err
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").symlink_to(TINY_MODEL / "config.json")
    code, _, err = grpo("files", "upload", str(tmp_path / "model"), "--purpose", "model")
    assert code == 2 and "is a link" in err
    code, _, err = grpo("files", "show", f"file-{'0' * 24}")
    assert code == 2 and "HTTP 404" in err
    code, _, err = grpo("files", "rm", "not-an-id")
    assert code == 2 and "HTTP 422" in err
