"""The API process's memory and CPU while it checks small uploads that decode to a lot.

What is measured
    For each bomb (tests/upload_bombs.py: a GNU long-name header of 1 GiB, a PAX header of
    256 MiB, a model whose weights are 4 GiB of zeros, a 581-byte dictionary-encoded Parquet file
    of 50,000 x 10 kB, JSONL nested 100,000 deep) and a normal upload of the same size as
    uploaded (a model of random weights, gzipped; plain JSONL rows), one ``POST /v1/files``: the
    answer's status, the server's peak RSS over its RSS just before (sampled every 10 ms), and
    the CPU seconds the server spent on it, after one warm-up upload of each kind (imports and
    pools made), so that "before" is idle. The bound the issue asks for is peak - idle <= 64 MiB.

How
    A real server process (``python -m uvicorn --factory api.main:create_app``) on a SQLite database
    migrated to head and the Redis at ``_service_stack.REDIS_URL``, with
    ``GRPO_UPLOAD_MAX_UNPACKED_BYTES`` at 1 GiB. ``PYTHONPATH`` chooses the code the server runs, so
    the same script measures an older checkout too.

Usage
    PYTHONPATH=$PWD .venv/bin/python benchmarks/upload_memory.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import httpx
import psutil
from _service_stack import migrated_database, uvicorn_server

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
from upload_bombs import (  # noqa: E402 - after the tests' folder is on the path
    deep_json_row,
    extended_header_bomb,
    parquet_dictionary_bomb,
    zeros_model,
)

MAX_UNPACKED = 2**30


def _random_model(path: Path, size: int) -> Path:
    """A model whose weights are random bytes: its tar.gz is about ``size``, as uploaded."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("config.json", b"{}"), ("tokenizer.json", b"{}"),
                           ("model.safetensors", os.urandom(size))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _normal_rows(path: Path, size: int) -> Path:
    """Plain rows of about ``size`` bytes: JSONL, or Parquet (a few rows) where ``path`` says so."""
    row = b'{"prompt": "What is 2+3?", "answer": "5"}\n'
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"prompt": ["What is 2+3?"] * 4, "answer": ["5"] * 4}), path)
    else:
        path.write_bytes(row * max(1, size // len(row)))
    return path


def cases(folder: Path) -> list[tuple[str, str, Path, Path]]:
    """(name, purpose, bomb, a normal upload of the bomb's size)."""
    made = [
        ("gnu long name 1 GiB", "model", extended_header_bomb(folder / "L.tar.gz", b"L", 2**30)),
        ("pax header 256 MiB", "model", extended_header_bomb(folder / "x.tar.gz", b"x", 2**28)),
        ("zeros model 4 GiB", "model", zeros_model(folder / "zeros.tar.gz", 4 * 2**30)),
        ("parquet 50,000 x 10 kB", "dataset", parquet_dictionary_bomb(folder / "bomb.parquet")),
    ]
    (folder / "deep.jsonl").write_bytes(deep_json_row(100_000))
    made.append(("jsonl 100,000 deep", "dataset", folder / "deep.jsonl"))
    out = []
    for name, purpose, bomb in made:
        size = bomb.stat().st_size
        normal = _random_model(folder / f"n{len(out)}.tar.gz", size) if purpose == "model" \
            else _normal_rows(folder / f"n{len(out)}{bomb.suffix}", size)
        out.append((name, purpose, bomb, normal))
    return out


def measure(client: httpx.Client, pid: int, purpose: str, path: Path) -> tuple[int, float, float]:
    """(status, peak RSS MiB over the RSS before, server CPU seconds) of one upload."""
    process = psutil.Process(pid)
    before, cpu = process.memory_info().rss, sum(process.cpu_times()[:2])
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with path.open("rb") as handle:
        response = client.post("/v1/files", data={"purpose": purpose}, files={"file": (path.name, handle)})
    done.set()
    sampler.join()
    peak[0] = max(peak[0], process.memory_info().rss)
    return response.status_code, (peak[0] - before) / 2**20, sum(process.cpu_times()[:2]) - cpu


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    from api.store import teams
    from api.store.db import session_scope

    with tempfile.TemporaryDirectory(prefix="grpo-bench-uploads-") as tmp, migrated_database("sqlite") as url:
        folder = Path(tmp)
        table = cases(folder)
        with session_scope(url) as session:
            teams.create_team(session, "bombs")
            key = teams.create_key(session, "bombs", False, "bench")[1]
        spool = folder / "spool"
        spool.mkdir()
        with uvicorn_server(url, upload_max_unpacked_bytes=MAX_UNPACKED, upload_spool_dir=spool,
                            namespace=f"bench{uuid.uuid4().hex[:6]}") as (base, pid), \
                httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=600,
                             trust_env=False) as client:
            for _, purpose, _, normal in table:  # warm-up: imports and pools made
                measure(client, pid, purpose, normal)
            print("| upload | as uploaded | status | peak RSS over idle MiB | server CPU s | "
                  "normal: status | normal: RSS MiB | normal: CPU s | RSS bomb - normal MiB |")
            print("|---|---|---|---|---|---|---|---|---|")
            for name, purpose, bomb, normal in table:
                status, rss, cpu = measure(client, pid, purpose, bomb)
                n_status, n_rss, n_cpu = measure(client, pid, purpose, normal)
                print(f"| {name} | {bomb.stat().st_size:,} B | {status} | {rss:.0f} | {cpu:.2f} | "
                      f"{n_status} | {n_rss:.0f} | {n_cpu:.2f} | {rss - n_rss:+.0f} |", flush=True)


if __name__ == "__main__":
    main()
