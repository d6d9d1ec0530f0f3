"""Small uploads that decode to a lot, sent to a real ``grpo api`` process (its own, so its memory
is measured alone with psutil): each is refused (422 naming the field and the row or header, a
413 for the team's quota), and the process's RSS while it checks one stays within 64 MiB of what
it held idle. Also: a model counts against its team's quota unpacked; dataset text with a NUL or
a lone surrogate is refused naming its row and column; a client that drops its upload mid-body
is one line in the API's log, not a traceback. The bombs are built by tests/upload_bombs.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from service_db import fresh_postgres_url, migrated
from test_files_limits import PartialUpload
from upload_bombs import (
    deep_json_row,
    extended_header_bomb,
    long_integer_row,
    normal_jsonl,
    parquet_dictionary_bomb,
    zeros_model,
)
from waiting import wait_until

from api.cli.dev import free_port
from api.store import teams
from api.store.db import session_scope

REPO = Path(__file__).resolve().parents[2]
TOKEN = "bombs-operator-token-0b7e2a51c9d4"
MAX_UNPACKED = 256 * 2**20
RSS_MARGIN = 64 * 2**20


class ApiProcess:
    def __init__(self, url: str, process: subprocess.Popen, log: Path, database_url: str) -> None:
        self.url, self.process, self.log, self.database_url = url, process, log, database_url

    def key(self, quota: int | None = None) -> str:
        """A member's key of a new team (with an artifact quota of ``quota`` bytes)."""
        name = f"b{uuid.uuid4().hex[:8]}"
        with session_scope(self.database_url) as session:
            teams.create_team(session, name)
            if quota is not None:
                teams.set_artifact_quota(session, name, quota)
            return teams.create_key(session, name, False, f"{name} member")[1]

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                            trust_env=False)


@pytest.fixture(scope="module")
def api_process(tmp_path_factory, service_roots) -> Iterator[ApiProcess]:
    """``grpo api`` on a fresh Postgres database, with ``GRPO_UPLOAD_MAX_UNPACKED_BYTES`` at 256 MiB."""
    folder = tmp_path_factory.mktemp("bombs-api")
    with fresh_postgres_url("grpo_bombs") as database_url, migrated(database_url):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
        env.update(GRPO_DATABASE_URL=database_url, GRPO_REDIS_URL=os.environ["GRPO_TEST_REDIS_URL"],
                   GRPO_API_TOKEN=TOKEN, GRPO_MODELS_ROOT=str(service_roots["models"]),
                   GRPO_DATA_ROOT=str(service_roots["data"]), GRPO_ARTIFACTS_ROOT=str(folder / "artifacts"),
                   GRPO_NAMESPACE=f"bombs{uuid.uuid4().hex[:6]}", GRPO_UPLOAD_SPOOL_DIR=str(folder),
                   GRPO_UPLOAD_MAX_UNPACKED_BYTES=str(MAX_UNPACKED), OMP_NUM_THREADS="1")
        port, log = free_port(), folder / "api.log"
        with log.open("w") as handle:
            process = subprocess.Popen([sys.executable, "-m", "api.cli.main", "api", "--port", str(port)],
                                       cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(ready, 60, "grpo api to answer", interval=0.2, details=log.read_text)
            yield ApiProcess(url, process, log, database_url)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, tuple[str, Path, str]]:
    """name: (purpose, file, what the 422 says)."""
    folder = tmp_path_factory.mktemp("bombs")

    def written(name: str, data: bytes) -> Path:
        (folder / name).write_bytes(data)
        return folder / name

    return {
        "gnu long name 1 GiB": ("model", extended_header_bomb(folder / "L.tar.gz", b"L", 2**30),
                                "long name or link header of 1073741824 bytes"),
        "gnu long link 256 MiB": ("model", extended_header_bomb(folder / "K.tar.gz", b"K", 2**28),
                                  "long name or link header of 268435456 bytes"),
        "pax 256 MiB": ("model", extended_header_bomb(folder / "x.tar.gz", b"x", 2**28),
                        "PAX header of 268435456 bytes"),
        "pax global 256 MiB": ("model", extended_header_bomb(folder / "g.tar.gz", b"g", 2**28),
                               "PAX header of 268435456 bytes"),
        "zeros unpacking to 1 GiB": ("model", zeros_model(folder / "zeros.tar.gz", 2**30),
                                     f"unpack to more than {MAX_UNPACKED} bytes"),
        "parquet dictionary": ("dataset", parquet_dictionary_bomb(folder / "bomb.parquet"),
                               "decodes to more than 268435456 bytes"),
        "jsonl 100,000 deep": ("dataset", written("deep.jsonl", deep_json_row(100_000)),
                               "line 2 is nested deeper than 64 levels"),
        "json 100,000 deep": ("dataset", written("deep.json", b'[{"prompt": "a", "x": ' + b"[" * 100_000
                                                 + b"]" * 100_000 + b"}]"), "nested deeper than 64 levels"),
        "jsonl 5,000 digits": ("dataset", written("digits.jsonl", long_integer_row(5_000)),
                               "line 2 holds a number too long to read"),
    }


class PeakRss:
    """The highest RSS of ``pid`` while the block runs, sampled every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.process, self.peak, self._done = psutil.Process(pid), 0, threading.Event()

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._done.wait(0.01)

    def __exit__(self, *_) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def send(client: httpx.Client, purpose: str, path: Path) -> httpx.Response:
    with path.open("rb") as handle:
        return client.post("/v1/files", data={"purpose": purpose}, files={"file": (path.name, handle)})


def warmed_up(api: ApiProcess, client: httpx.Client, tmp_path: Path) -> int:
    """The process's RSS once it has read each kind of upload (imports and pools made): its idle."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b"]}), tmp_path / "warm.parquet")
    (tmp_path / "warm.jsonl").write_bytes(normal_jsonl(1_000_000))
    for purpose, name in (("dataset", "warm.parquet"), ("dataset", "warm.jsonl")):
        assert send(client, purpose, tmp_path / name).status_code == 201
    zeros_model(tmp_path / "warm.tar.gz", 2**20)
    assert send(client, "model", tmp_path / "warm.tar.gz").status_code == 201
    return psutil.Process(api.process.pid).memory_info().rss


@pytest.mark.parametrize("name", ["gnu long name 1 GiB", "gnu long link 256 MiB", "pax 256 MiB",
                                  "pax global 256 MiB", "zeros unpacking to 1 GiB", "parquet dictionary",
                                  "jsonl 100,000 deep", "json 100,000 deep", "jsonl 5,000 digits"])
def test_a_bomb_is_refused_within_64_mib_of_idle(api_process, bombs, name, tmp_path) -> None:
    purpose, path, words = bombs[name]
    with api_process.client(api_process.key()) as client:
        idle = warmed_up(api_process, client, tmp_path)
        with PeakRss(api_process.process.pid) as rss:
            response = send(client, purpose, path)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "file" and words in error["message"], error
        assert [f for f in client.get("/v1/files").json()["items"] if f["filename"] == path.name] == []
    assert rss.peak - idle <= RSS_MARGIN, f"{name}: {(rss.peak - idle) / 2**20:.0f} MiB over idle"


def test_a_model_counts_against_the_quota_unpacked(api_process, tmp_path) -> None:
    model = zeros_model(tmp_path / "m.tar.gz", 100 * 2**20)  # ~100 KB as uploaded
    with api_process.client(api_process.key(quota=150 * 2**20)) as client:
        first = send(client, "model", model)
        assert first.status_code == 201, first.text
        assert first.json()["bytes"] < 2**20 and first.json()["unpacked_bytes"] >= 100 * 2**20
        second = send(client, "model", model)  # it would fit as uploaded, not unpacked
        assert second.status_code == 413, second.text
        assert second.json()["error"]["code"] == "artifact_quota_exceeded"
        assert "unpacks to more than" in second.json()["error"]["message"]
        assert len(client.get("/v1/files").json()["items"]) == 1


@pytest.mark.parametrize("name, content, words", [
    ("nul.jsonl", b'{"prompt": "a"}\n{"prompt": "b", "answer": "5\\u0000"}\n',
     "row 1: column 'answer' holds a NUL"),
    ("surrogate.jsonl", b'{"prompt": "a"}\n{"prompt": "b \\ud800"}\n',
     "row 1: column 'prompt' holds a lone surrogate (U+D800)"),
    ("nul.csv", b"prompt,answer\na,1\nb,2\x00\n", "row 1: column 'answer' holds a NUL"),
    ("key.jsonl", b'{"prompt": "a", "x\\u0000": 1}\n', "row 0: column 'x\\x00' holds a NUL"),
])
def test_dataset_text_with_a_nul_or_a_lone_surrogate_is_refused_naming_row_and_column(
        api_process, tmp_path, name, content, words) -> None:
    (tmp_path / name).write_bytes(content)
    with api_process.client(api_process.key()) as client:
        response = send(client, "dataset", tmp_path / name)
        assert response.status_code == 422, response.text
        assert words in response.json()["error"]["message"], response.json()
        assert client.get("/v1/files").json()["items"] == []


def test_a_client_that_drops_an_upload_is_one_log_line(api_process) -> None:
    before = api_process.log.read_text()
    dropped = PartialUpload(api_process.url, api_process.key(), normal_jsonl(100_000))
    spool = api_process.log.parent
    wait_until(lambda: list(spool.glob("grpo-upload-*")), 20, "the upload's body to be read")
    dropped.abort()
    wait_until(lambda: "went away" in api_process.log.read_text()[len(before):], 20,
               "the dropped upload's line", details=api_process.log.read_text)
    added = api_process.log.read_text()[len(before):]
    assert added.count("went away") == 1, added
    assert "Traceback" not in added and "ClientDisconnect" not in added, added
