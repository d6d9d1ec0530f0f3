"""A trained model as a member takes it away, through the real stack (``grpo api``, the scheduler
and a Celery worker, each its own process): a final export that meets a real full disk (a filled
tmpfs over the job's folder, tests/full_disk.py) fails the job ``disk_full`` and a retry over HTTP
exports it without training again; a LoRA job's downloads name its base model by the spec's
source, never by a folder of the server."""

from __future__ import annotations

import io
import json
import tarfile
from contextlib import ExitStack

import httpx
import pytest
import torch
from full_disk import small_disk
from safetensors.torch import load_file
from sqlalchemy import select

from api.artifacts.paths import CHECKPOINTS_DIR, checkpoint_dir, job_dir, model_dir
from api.store.db import session_scope
from api.store.tables import JobMetric

pytestmark = pytest.mark.slow

TOKEN = "model-downloads-operator-token-5f0c2b9e"


def members(body: bytes) -> dict[str, bytes]:
    """The files of a downloaded tar, by their name under its top folder."""
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def run_stack(processes, pool: str, wait_worker_ready) -> httpx.Client:
    url = processes.api(TOKEN)
    processes.scheduler()
    processes.worker(pool)
    wait_worker_ready(pool, processes)
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30,
                        trust_env=False)


def test_a_full_disk_at_the_final_export_fails_disk_full_and_a_retry_exports_without_training_again(
        processes, submit, tiny_spec, pool, settings, database_url, wait_for, finished, wait_worker_ready):
    job_id = submit(tiny_spec("full-disk", pool=pool, max_steps=2, checkpoint_every=1))
    folder = job_dir(settings, job_id)
    with ExitStack() as disks:
        # The job's folder is a disk with no room; its checkpoints have a disk of their own, so
        # training and its checkpoints succeed and the final export is what meets the full disk.
        disk = disks.enter_context(small_disk(folder, 1 << 20))
        disks.enter_context(small_disk(folder / CHECKPOINTS_DIR, 64 << 20))
        disk.fill()
        with run_stack(processes, pool, wait_worker_ready) as api:
            failed = wait_for(lambda: finished(job_id), 180, "the job to end", processes)
            assert (failed.status, failed.error.code) == ("failed", "disk_full"), failed.error
            out = model_dir(settings, job_id)
            assert f"the model folder {out} ({disk.free_bytes} bytes free)" in failed.error.message
            assert sorted(p.name for p in folder.iterdir()) == [".filler", CHECKPOINTS_DIR]  # no temp folder
            final = checkpoint_dir(settings, job_id) / "step-2"
            assert (final / "trainer_state.json").is_file()  # the last checkpoint is whole

            disk.free()
            retried = api.post(f"/v1/jobs/{job_id}/retry")
            assert retried.status_code == 200 and retried.json()["status"] == "queued", retried.text
            done = wait_for(lambda: finished(job_id), 180, "the retried job to end", processes)
            assert done.status == "succeeded", done.error

            assert [m["step"] for m in api.get(f"/v1/jobs/{job_id}/metrics").json()["items"]] == [1, 2]
            with session_scope(database_url) as session:
                writers = session.scalars(select(JobMetric.attempt).where(JobMetric.job_id == job_id)).all()
            assert writers == [1, 1]  # the retry trained no step again
            events = api.get(f"/v1/jobs/{job_id}/events", params={"limit": 100}).json()["items"]
            assert [e["data"]["step"] for e in events if e["type"] == "resumed"] == [2]
            download = api.get(f"/v1/jobs/{job_id}/model")
            assert download.status_code == 200, download.text
            files = members(download.content)
            assert files["model.safetensors"] == (final / "model.safetensors").read_bytes()


def test_a_lora_jobs_downloads_name_its_base_by_the_spec_source_and_hold_no_server_path(
        processes, submit, tiny_spec, pool, settings, roots, wait_for, finished, wait_worker_ready,
        tmp_path_factory, tmp_path):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    lora = {"source": "path:tiny", "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}}
    job_id = submit(tiny_spec("adapter", pool=pool, max_steps=2, checkpoint_every=1, model=lora,
                              grpo={"learning_rate": 0.05}))
    with run_stack(processes, pool, wait_worker_ready) as api:
        done = wait_for(lambda: finished(job_id), 180, "the job to end", processes)
        assert done.status == "succeeded", done.error
        downloads = {path: api.get(f"/v1/jobs/{job_id}/{path}")
                     for path in ("model", "checkpoints/1/archive")}
    # Every folder of this test run (the service's roots, the models they were copied from).
    server = str(tmp_path_factory.getbasetemp()).encode()
    for path, response in downloads.items():
        assert response.status_code == 200, response.text
        files = members(response.content)
        assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "path:tiny", path
        assert [name for name, data in files.items() if server in data] == [], path

    # The member loads the adapter onto their own copy of the base: it is the job's trained one.
    unpacked = tmp_path / "download"
    unpacked.mkdir()
    for name, data in members(downloads["model"].content).items():
        (unpacked / name).write_bytes(data)
    base = AutoModelForCausalLM.from_pretrained(roots["models"] / "tiny")
    model = PeftModel.from_pretrained(base, unpacked)
    trained = load_file(checkpoint_dir(settings, job_id) / "step-2" / "adapter_model.safetensors")
    loaded = get_peft_model_state_dict(model)
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)
