"""Taking a model away over real HTTP (Postgres and SQLite): a job's final model and a kept
checkpoint stream as tars of Hugging Face folders with an exact length, serve ranges (a broken
download continues), stay inside the team, and ``grpo download`` unpacks one into a folder that
``from_pretrained`` loads. The files are laid out as the worker leaves them (the worker's own
export is tested in tests/worker/test_final_model.py)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from api.artifact_paths import checkpoint_dir, model_dir
from api.cli.main import main
from api.http.tar_stream import TarStream


@pytest.fixture
def finished_job(alpha, job_spec, worker, api_server, tiny_model_dir: Path) -> dict:
    """A job with steps 1-2, a complete checkpoint of step 2, an incomplete one of step 4 (being
    written) and a final model, as the worker leaves them."""
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    worker.start(job["id"])
    for step in (1, 2):
        worker.step(job["id"], step)
    settings = api_server.settings
    step_2 = checkpoint_dir(settings, job["id"]) / "step-2"
    shutil.copytree(tiny_model_dir, step_2)
    torch.save({"state": {}}, step_2 / "optimizer.pt")
    (step_2 / "trainer_state.json").write_text("{}")
    shutil.copytree(tiny_model_dir, checkpoint_dir(settings, job["id"]) / "step-4")
    final = model_dir(settings, job["id"])
    shutil.copytree(tiny_model_dir, final)
    (final / "adapter").mkdir()
    (final / "adapter" / "adapter_config.json").write_text("{}")
    return job


def members(body: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_final_model_streams_as_a_tar_with_its_length_and_ranges(alpha, finished_job, api_server) -> None:
    job_id = finished_job["id"]
    response = alpha.get(f"/v1/jobs/{job_id}/model")
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    assert int(response.headers["content-length"]) == len(response.content)
    assert f'filename="job-{job_id}-model.tar"' in response.headers["content-disposition"]
    files = members(response.content)
    folder = model_dir(api_server.settings, job_id)
    assert files[f"job-{job_id}-model/model.safetensors"] == (folder / "model.safetensors").read_bytes()
    assert f"job-{job_id}-model/adapter/adapter_config.json" in files

    whole = response.content
    for asked, expected in (("bytes=100-1123", whole[100:1124]), ("bytes=-10", whole[-10:]),
                            (f"bytes={len(whole) - 5}-", whole[-5:])):
        part = alpha.get(f"/v1/jobs/{job_id}/model", headers={"Range": asked})
        assert part.status_code == 206 and part.content == expected, asked
        assert part.headers["content-range"].endswith(f"/{len(whole)}")
    outside = alpha.get(f"/v1/jobs/{job_id}/model", headers={"Range": f"bytes={len(whole)}-"})
    assert outside.status_code == 416 and outside.headers["content-range"] == f"bytes */{len(whole)}"


def test_a_kept_checkpoint_streams_as_a_model_folder_without_training_state(alpha, finished_job) -> None:
    job_id = finished_job["id"]
    response = alpha.get(f"/v1/jobs/{job_id}/checkpoints/2/archive")
    assert response.status_code == 200 and int(response.headers["content-length"]) == len(response.content)
    files = members(response.content)
    prefix = f"job-{job_id}-step-2/"
    assert {f"{prefix}model.safetensors", f"{prefix}tokenizer.json", f"{prefix}README.md",
            f"{prefix}generation_config.json"} <= set(files)
    assert f"{prefix}optimizer.pt" not in files and f"{prefix}trainer_state.json" not in files
    card = files[f"{prefix}README.md"].decode()
    assert "for 2 steps" in card and "| reward | 0.02 |" in card  # step 2's metrics, from SQL
    for step, param in ((4, "step"), (3, "step")):  # being written; never written
        missing = alpha.get(f"/v1/jobs/{job_id}/checkpoints/{step}/archive")
        assert missing.status_code == 404 and missing.json()["error"]["param"] == param


def test_downloads_are_team_scoped_and_wait_for_the_model(alpha, client_for, team_keys, finished_job,
                                                         job_spec) -> None:
    beta = client_for(team_keys.beta)
    for path in ("model", "checkpoints/2/archive"):
        assert beta.get(f"/v1/jobs/{finished_job['id']}/{path}").status_code == 404
    fresh = alpha.post("/v1/jobs", json=job_spec()).json()
    waiting = alpha.get(f"/v1/jobs/{fresh['id']}/model")
    assert waiting.status_code == 404 and "no final model" in waiting.json()["error"]["message"]


def test_grpo_download_unpacks_a_folder_from_pretrained_loads_and_continues_a_broken_download(
        alpha, finished_job, api_server, team_keys, tmp_path, capsys) -> None:
    from transformers import AutoModelForCausalLM

    job_id = finished_job["id"]
    url = api_server.http_url
    out = tmp_path / "model"
    # A first try that broke off after 3000 bytes: the second continues from there.
    (tmp_path / ".model.tar.partial").write_bytes(alpha.get(f"/v1/jobs/{job_id}/model").content[:3000])
    key = team_keys.alpha
    assert main(["download", str(job_id), "-o", str(out), "--api-url", url, "--api-key", key]) == 0
    assert f"job {job_id}'s final model:" in capsys.readouterr().out
    assert not (tmp_path / ".model.tar.partial").exists()
    reference = AutoModelForCausalLM.from_pretrained(model_dir(api_server.settings, job_id))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    pairs = zip(reference.state_dict().values(), loaded.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    step_2 = tmp_path / "step-2"
    assert main(["download", str(job_id), "--step", "2", "-o", str(step_2), "--api-url", url,
                 "--api-key", key, "--json"]) == 0
    assert (step_2 / "README.md").is_file() and not (step_2 / "optimizer.pt").exists()
    with pytest.raises(SystemExit) as refused:  # never into a folder that holds something
        main(["download", str(job_id), "-o", str(out), "--api-url", url])
    assert refused.value.code == 2


def test_a_file_deleted_while_streaming_still_streams_whole(tmp_path) -> None:
    kept = tmp_path / "weights.bin"
    kept.write_bytes(bytes(range(256)) * 5000)
    archive = TarStream("ckpt", {"weights.bin": kept}, {"README.md": b"card"})
    kept.unlink()  # retention removed the checkpoint after the download began
    body = b"".join(archive.iter_range())
    assert len(body) == archive.length
    assert members(body) == {"ckpt/weights.bin": bytes(range(256)) * 5000, "ckpt/README.md": b"card"}


def test_tensorboard_files_download_as_written(alpha, finished_job, api_server, job_spec) -> None:
    from tensorboard_events import read_scalars

    from api.artifact_paths import tensorboard_dir
    from grpo_core.tracking import TensorBoardTracker

    job_id = finished_job["id"]
    tracker = TensorBoardTracker(tensorboard_dir(api_server.settings, job_id))
    for step in (1, 2):
        tracker.on_step({"step": step, "reward": step / 10})
    response = alpha.get(f"/v1/jobs/{job_id}/tensorboard")
    assert response.status_code == 200 and int(response.headers["content-length"]) == len(response.content)
    unpacked = api_server.settings.artifacts_root / "unpacked"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        tar.extractall(unpacked, filter="data")
    assert read_scalars(unpacked)["reward"] == pytest.approx({1: 0.1, 2: 0.2})  # float32 on disk
    untracked = alpha.post("/v1/jobs", json=job_spec()).json()
    missing = alpha.get(f"/v1/jobs/{untracked['id']}/tensorboard")
    assert missing.status_code == 404 and "report_to tensorboard" in missing.json()["error"]["message"]
