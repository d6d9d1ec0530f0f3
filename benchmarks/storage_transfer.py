"""Object storage transfers (issue 26 item 6): a model archive through the Files API, and a
checkpoint into the store, each against a plain copy of the same bytes measured in the same run.

What is measured
    1. A model archive of ``--sizes-mib`` (default 1024 and 256 MiB: a valid tar of a Hugging Face
       folder, ``config.json``, tokenizer files and a ``model.safetensors`` whose real header
       describes one F32 tensor of random bytes) uploaded with ``POST /v1/files`` (multipart,
       streamed from disk by httpx) and downloaded with ``GET /v1/files/{id}/content`` (streamed
       to disk), on each of ``--stores``: the local folder store and an S3 bucket on moto's
       server (``tests/storage_server.py``, a process of its own). MiB/s each way, and the API
       process's resident set (psutil, sampled every 0.1 s) before and at its peak during each
       transfer: it must not grow with the file's size. The download is checked (size, SHA-256)
       after its clock stopped. The reference, timed just before with the same bytes:
       ``shutil.copyfile`` on the same disk (local), or boto3 on the same S3 server (s3):
       ``upload_file`` with default settings up, one ``get_object`` streamed to disk down.
       ``api/ref`` < 1 is what the API costs on top (an upload is spooled, hashed, checked, then
       stored; a download streams through it). Median of ``--repeats`` round trips; the RSS peak
       is the highest of them, "before" the first's.
    2. A checkpoint of the realistic preset's model (``core_vs_trl.py --preset realistic``:
       random-init ~31M-parameter Qwen2, 32k vocabulary) written by ``grpo_core.run.checkpoint``
       with a stepped AdamW (so ``optimizer.pt`` is full size), then stored with
       ``ObjectStore.put_folder`` as the worker does (``worker/checkpoint_uploads.py``: completion
       mark last) into a local store folder and into the S3 bucket; median of ``--repeats``.
       Reference: ``shutil.copytree`` (local) and boto3 ``upload_file`` of each file (s3).

How
    The API is ``python -m uvicorn --factory api.main:create_app`` configured by ``GRPO_*``
    variables (``benchmarks/_service_stack.py``) on a SQLite database migrated to head, one
    server per store; the client is this process. Everything sits on one disk.

Usage
    PYTHONPATH=$PWD .venv/bin/python benchmarks/storage_transfer.py [--sizes-mib 1024,256]
        [--stores local,s3] [--repeats 3] [--no-checkpoint]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import struct
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
from _common import format_table, median
from _service_stack import ROOT, TOKEN, RssSampler, loadavg, migrated_database, uvicorn_server

from api.storage.digests import file_sha256

sys.path.append(str(ROOT / "tests"))
from storage_server import s3_server  # noqa: E402 - tests/ is a plain folder of helpers too

MiB = 1024 * 1024
CHUNK = 4 * MiB


class _Weights(io.RawIOBase):
    """A safetensors file read front to back: its header, then ``size`` random bytes."""

    def __init__(self, header: bytes, size: int) -> None:
        self.pending, self.left = header, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        """Exactly ``n`` bytes while there are that many: tarfile takes a short read for the end."""
        out, self.pending = self.pending[:n], self.pending[n:]
        take = min(n - len(out), self.left)
        self.left -= take
        return out + os.urandom(take)


def build_archive(path: Path, mib: int) -> Path:
    """A tar of an HF-like folder whose ``model.safetensors`` makes it ``mib`` MiB or so."""
    data_bytes = mib * MiB - 64 * 1024
    meta = {"w": {"dtype": "F32", "shape": [data_bytes // 4], "data_offsets": [0, data_bytes // 4 * 4]},
            "__metadata__": {"format": "pt"}}
    header = json.dumps(meta).encode()
    header += b" " * (-len(header) % 8)  # safetensors pads its header to 8 bytes
    small = {"config.json": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
             "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}},
             "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast"}}
    with tarfile.open(path, "w") as archive:
        for name, value in small.items():
            raw = json.dumps(value).encode()
            info = tarfile.TarInfo(f"model/{name}")
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
        info = tarfile.TarInfo("model/model.safetensors")
        info.size = 8 + len(header) + data_bytes // 4 * 4
        archive.addfile(info, _Weights(struct.pack("<Q", len(header)) + header, data_bytes // 4 * 4))
    return path


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def api_round_trip(base: str, rss: RssSampler, archive: Path, target: Path) -> dict:
    """Upload then download ``archive`` through the API: each direction's seconds, and the API's
    resident set in the second before it began and at its peak during it (MiB)."""
    client = httpx.Client(base_url=base, timeout=900, trust_env=False,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    answer: dict = {}

    def upload() -> None:
        with archive.open("rb") as handle:
            response = client.post("/v1/files", data={"purpose": "model"},
                                   files={"file": (archive.name, handle, "application/x-tar")})
        response.raise_for_status()
        answer.update(response.json())

    def download() -> None:
        with client.stream("GET", f"/v1/files/{answer['id']}/content") as response, target.open("wb") as out:
            response.raise_for_status()
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)

    measured = {}
    for direction, action in (("up", upload), ("down", download)):
        time.sleep(1.0)  # a second of samples before it
        start = time.monotonic()
        seconds = timed(action)
        time.sleep(0.25)  # the sample that falls after its end
        measured[direction] = (seconds, max(rss.between(start - 1.0, start)),
                               max(rss.between(start, start + seconds + 0.25)))
    size = archive.stat().st_size
    if target.stat().st_size != size or file_sha256(target) != answer["sha256"]:
        raise RuntimeError(f"the download of {answer['id']} differs from the upload")
    client.delete(f"/v1/files/{answer['id']}").raise_for_status()  # moto holds objects in memory
    client.close()
    target.unlink()
    return measured


def reference(kind: str, archive: Path, target: Path, s3) -> dict[str, float]:
    """Seconds to move the same bytes without the API: a file copy, or boto3 to the same server."""
    if kind == "local":
        seconds = timed(lambda: shutil.copyfile(archive, target))
        target.unlink()
        return {"up": seconds, "down": seconds}
    client = boto3_client(s3)

    def download() -> None:
        # One GET streamed to disk, as the API serves a download. Not download_file: its ranged
        # GETs each make moto read and copy the whole object (O(size²) on moto, not on real S3).
        body = client.get_object(Bucket=s3.bucket, Key="reference/archive")["Body"]
        with target.open("wb") as out:
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)

    up = timed(lambda: client.upload_file(str(archive), s3.bucket, "reference/archive"))
    down = timed(download)
    client.delete_object(Bucket=s3.bucket, Key="reference/archive")
    target.unlink()
    return {"up": up, "down": down}


def boto3_client(s3):
    """A plain boto3 client of the server, with the store's retries and timeouts (the reference
    differs from the store in what it does, not in how patiently it waits)."""
    from api.storage.s3 import s3_client

    return s3_client(s3.env, concurrency=10)  # s3transfer's default concurrency


def archive_rows(args: argparse.Namespace, work: Path, s3) -> list[list]:
    archives = {mib: build_archive(work / f"model-{mib}.tar", mib) for mib in args.sizes_mib}
    rows = []
    for kind in args.stores:
        settings = {"artifacts_root": work / "artifacts", "upload_spool_dir": work}
        if kind == "s3":
            os.environ.update(s3.env)  # the server's store reads the standard AWS_* variables
            settings["storage_url"] = s3.url("api")
        with (migrated_database("sqlite") as database, uvicorn_server(database, **settings) as (base, pid),
              RssSampler(pid) as rss):
            for archive in archives.values():
                size, refs, runs = archive.stat().st_size, [], []
                for _ in range(args.repeats):  # each reference just before its API round trip
                    refs.append(reference(kind, archive, work / "reference.copy", s3))
                    runs.append(api_round_trip(base, rss, archive, work / "download.tar"))
                load = loadavg()  # read after: its 1-minute figure spans the transfers
                for direction in ("up", "down"):
                    seconds = median([run[direction][0] for run in runs])
                    before = runs[0][direction][1]  # the first: an upload's is the idle server's
                    peak = max(run[direction][2] for run in runs)
                    rate, ref_rate = size / MiB / seconds, size / MiB / median([r[direction] for r in refs])
                    rows.append([kind, round(size / MiB), direction, round(seconds, 2), round(rate, 1),
                                 round(ref_rate, 1), round(rate / ref_rate, 3), round(before), round(peak),
                                 load])
                print(format_table(ARCHIVE_HEADERS, rows[-2:]).split("\n", 2)[-1], flush=True)
    return rows


ARCHIVE_HEADERS = ["store", "file_mib", "way", "api_s", "api_mib_s", "ref_mib_s", "api/ref", "rss_before_mib",
                   "rss_peak_mib", "load_1/5/15"]


def realistic_checkpoint(work: Path) -> Path:
    """``step-1`` of the realistic model, written as the trainer writes it."""
    import torch
    import transformers
    from _bench_realistic import build_realistic_model, cached_tokenizer
    from transformers import AutoModelForCausalLM

    from grpo_core.io.model_loading import PolicyAndReference
    from grpo_core.run.checkpoint import TrainerState, save_checkpoint

    transformers.utils.logging.disable_progress_bar()  # one line per figure, not per shard
    model = AutoModelForCausalLM.from_pretrained(build_realistic_model(work / "realistic", seed=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for parameter in model.parameters():  # one step, so the optimizer holds both moments
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = TrainerState(step=1, num_tokens=0, sampler={"epoch": 0, "position": 0}, iteration=0,
                         has_experience=False)
    return save_checkpoint(work / "checkpoints", state, models=PolicyAndReference(model, None, False),
                           tokenizer=cached_tokenizer(), optimizer=optimizer, scheduler=scheduler)


def upload_each(client, bucket: str, prefix: str, files: list[Path]) -> None:
    for path in files:
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def checkpoint_rows(args: argparse.Namespace, work: Path, s3) -> list[list]:
    from api.artifacts.paths import COMPLETE_MARK, checkpoint_key
    from api.storage import open_store

    folder = realistic_checkpoint(work)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    rows = []
    for kind in args.stores:
        store = open_store(s3.url("ckpt") if kind == "s3" else str(work / "store"), env=s3.env)
        client = boto3_client(s3)
        runs, refs = [], []
        for repeat in range(args.repeats):
            key, copy = checkpoint_key(repeat + 1, 1, 1), work / f"copy-{repeat}"
            if kind == "local":
                refs.append(timed(lambda copy=copy: shutil.copytree(folder, copy)))
                shutil.rmtree(copy)
            else:
                refs.append(timed(lambda r=repeat, c=client: upload_each(c, s3.bucket, f"ref/{r}", files)))
                for path in files:  # moto holds objects in memory
                    client.delete_object(Bucket=s3.bucket, Key=f"ref/{repeat}/{path.name}")
            runs.append(timed(lambda key=key, s=store: s.put_folder(key, folder, last=[COMPLETE_MARK])))
            store.delete_prefix(key)
        seconds, ref, load = median(runs), median(refs), loadavg()
        rate = size / MiB / seconds
        rows.append([kind, len(files), round(size / MiB, 1), round(seconds, 2), round(rate, 1), round(ref, 2),
                     round(ref / seconds, 3), load])
        print(format_table(CHECKPOINT_HEADERS, rows[-1:]).split("\n", 2)[-1], flush=True)
    return rows


CHECKPOINT_HEADERS = ["store", "files", "mib", "put_folder_s", "mib_s", "ref_s", "ref/api", "load_1/5/15"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=lambda v: [int(x) for x in v.split(",") if x],
                        default=[1024, 256], help="archive sizes; empty: the checkpoint only")
    parser.add_argument("--stores", type=lambda v: v.split(","), default=["local", "s3"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-checkpoint", action="store_true")
    args = parser.parse_args()
    print(f"cpus {os.cpu_count()}, load {loadavg()}, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="grpo-bench-storage-") as folder, s3_server() as s3:
        work = Path(folder)
        archives = archive_rows(args, work, s3) if args.sizes_mib else []
        checkpoints = [] if args.no_checkpoint else checkpoint_rows(args, work, s3)
    if archives:
        print("\nmodel archive through the Files API\n" + format_table(ARCHIVE_HEADERS, archives))
    if checkpoints:
        print("\nrealistic preset's checkpoint, put_folder\n" + format_table(CHECKPOINT_HEADERS, checkpoints))


if __name__ == "__main__":
    main()
