"""Taking a model away over real HTTP (Postgres and SQLite): a job's final model and a kept
checkpoint stream as tars of Hugging Face folders with an exact length, serve ranges (a broken
download continues), stay inside the team, and ``grpo download`` unpacks one into a folder that
``from_pretrained`` loads. The files are laid out as the worker leaves them (the worker's own
export is tested in tests/worker/test_final_model.py)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from waiting import wait_until

from api.artifacts.paths import checkpoint_dir, model_dir
from api.cli.main import main
from api.http.download_pins import PINS_DIR, DownloadPins
from api.http.tar_stream import TarStream


@pytest.fixture
def finished_job(alpha, job_spec, worker, api_server, tiny_model_dir: Path) -> dict:
    """A job with steps 1-2, a complete checkpoint of step 2 (with its row), an incomplete one of
    step 4 (being written), a complete one of step 5 that a stale attempt left (no row) and a
    final model, as the worker leaves them."""
    job = alpha.post("/v1/jobs", json=job_spec()).json()
    worker.start(job["id"])
    for step in (1, 2):
        worker.step(job["id"], step)
    settings = api_server.settings
    step_2 = checkpoint_dir(settings, job["id"]) / "step-2"
    shutil.copytree(tiny_model_dir, step_2)
    torch.save({"state": {}}, step_2 / "optimizer.pt")
    (step_2 / "trainer_state.json").write_text("{}")
    worker.reporter(job["id"]).on_checkpoint(2, step_2)  # published: its row
    shutil.copytree(tiny_model_dir, checkpoint_dir(settings, job["id"]) / "step-4")
    stale = checkpoint_dir(settings, job["id"]) / "step-5"  # complete, but no attempt published it
    shutil.copytree(step_2, stale)
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
    for step, param in ((4, "step"), (3, "step"), (5, "step")):  # being written; never; not published
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


SHARD_BYTES = 24 * 1024 * 1024  # four of them are far more than the sockets between us buffer


def write_shards(folder: Path, count: int = 4) -> dict[str, str]:
    """A model split in ``count`` weight shards (random ends, a sparse middle) beside its config;
    the sha256 of every file, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    for n in range(1, count + 1):
        with (folder / f"model-{n:05d}-of-{count:05d}.safetensors").open("wb") as shard:
            shard.write(os.urandom(4096))
            shard.seek(SHARD_BYTES - 4096)
            shard.write(os.urandom(4096))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def open_files_under(root: Path) -> list[str]:
    """The files under ``root`` this process (the test server runs in it) has open, but for the
    lock the server's pinned downloads hold for the life of the process."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # an fd closed while listing
            target = os.readlink(fd)
            if target.startswith(str(root.resolve())) and not target.endswith(".lock"):
                found.append(target)
    return found


def pinned_links(root: Path) -> list[Path]:
    # os.walk, not rglob: a download's folder can be removed while it is being listed, and walk
    # skips a folder gone under it where rglob raises FileNotFoundError.
    return [Path(folder, name) for folder, _, names in os.walk(root / PINS_DIR) for name in names
            if not name.endswith(".lock")]


def hashes_by_name(body: bytes, prefix: str) -> dict[str, str]:
    return {name.removeprefix(prefix): hashlib.sha256(data).hexdigest()
            for name, data in members(body).items()}


def read_with_pauses(client, url: str, root: Path, at_first_pause=None) -> bytes:
    """The whole response to ``url``, read with a pause at its first bytes and after every
    further shard's worth: each lasts until the server, its socket buffers full, holds none of
    the files under ``root`` open (``at_first_pause`` runs then). Counting what is open while
    the server reads could see one file twice: it reopens the file for every chunk."""
    def idle() -> None:
        wait_until(lambda: not open_files_under(root), 10, "the waiting download to hold no file open",
                   details=lambda: "\n".join(open_files_under(root)))

    with client.stream("GET", url) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()
        body, since_pause = [next(chunks)], 0
        idle()
        if at_first_pause is not None:
            at_first_pause()
        for chunk in chunks:
            body.append(chunk)
            since_pause += len(chunk)
            if since_pause >= SHARD_BYTES:
                idle()
                since_pause = 0
    return b"".join(body)


def test_a_download_waiting_on_its_client_holds_none_of_its_files_open(alpha, api_server,
                                                                        job_spec) -> None:
    """It opens a file for each chunk it reads, so it never holds more than one; and it stays
    byte for byte the model's files."""
    job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    expected = write_shards(model_dir(api_server.settings, job_id))
    root = api_server.settings.artifacts_root
    body = read_with_pauses(alpha, f"/v1/jobs/{job_id}/model", root)
    assert hashes_by_name(body, f"job-{job_id}-model/") == expected


def test_a_checkpoint_deleted_by_retention_mid_download_still_streams_whole(alpha, api_server, worker,
                                                                            job_spec) -> None:
    """Files are opened only as they stream, yet a checkpoint that retention deletes after the
    first bytes went out downloads whole (its files are pinned); the pins go with the download."""
    job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    folder = checkpoint_dir(api_server.settings, job_id) / "step-3"
    expected = write_shards(folder)
    (folder / "trainer_state.json").write_text("{}")  # complete; training state, not downloaded
    worker.reporter(job_id).on_checkpoint(3, folder)  # published: its row
    root = api_server.settings.artifacts_root
    body = read_with_pauses(alpha, f"/v1/jobs/{job_id}/checkpoints/3/archive", root,
                            at_first_pause=lambda: shutil.rmtree(folder))
    streamed = hashes_by_name(body, f"job-{job_id}-step-3/")
    assert {name: streamed[name] for name in expected} == expected
    wait_until(lambda: not pinned_links(root), 10, "the finished download to remove its links")


def test_an_abandoned_download_removes_its_links(alpha, api_server, job_spec) -> None:
    job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    write_shards(model_dir(api_server.settings, job_id))
    root = api_server.settings.artifacts_root
    with alpha.stream("GET", f"/v1/jobs/{job_id}/model") as response:
        chunks = response.iter_bytes()  # kept: httpx drops the connection of an iterator let go
        next(chunks)
        assert pinned_links(root)
    wait_until(lambda: not pinned_links(root), 10, "the abandoned download to remove its links")


def test_a_killed_processs_pinned_files_are_removed_by_the_next(tmp_path) -> None:
    """A pinning process killed mid-download leaves its links; another process's first pin
    removes them, and never those of a process that lives."""
    kept, root = tmp_path / "weights.bin", tmp_path / "pins"
    kept.write_bytes(b"w" * 1000)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from api.http.download_pins import DownloadPins; "
         "DownloadPins(Path(sys.argv[1])).pin({'w': Path(sys.argv[2])}); print('pinned', flush=True); "
         "time.sleep(120)", str(root), str(kept)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "pinned"
        [theirs] = [p for p in root.iterdir() if p.is_dir()]
        living = DownloadPins(root)  # as another API process: it holds its lock while it lives
        ours = living.pin({"w": kept})
        assert theirs.is_dir() and ours.folder is not None and ours.folder.parent != theirs
    finally:
        holder.kill()
        holder.wait()
    assert DownloadPins(root).pin({"w": kept}).folder is not None
    assert not theirs.exists() and ours.folder.is_dir()  # the living one's is left
    ours.release()
    assert not ours.folder.exists() and kept.read_bytes() == b"w" * 1000


def test_a_file_replaced_before_its_turn_breaks_the_archive_off(tmp_path) -> None:
    """Never bytes that do not match the header: the file streamed must be the one sized."""
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"a" * 5000)
    archive = TarStream("ckpt", {"weights.bin": weights}, {"README.md": b"card"})
    newer = tmp_path / "newer.bin"
    newer.write_bytes(b"b" * 5000)
    newer.replace(weights)  # a newer export renamed into place
    with pytest.raises(OSError, match="replaced"):
        b"".join(archive.iter_range())


def test_tensorboard_files_download_as_written(alpha, finished_job, api_server, job_spec) -> None:
    from tensorboard_events import read_scalars

    from api.artifacts.paths import tensorboard_dir
    from grpo_core.run.tracking import TensorBoardTracker

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
