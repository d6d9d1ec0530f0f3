"""The object store's contract (api.storage), the same tests on both stores: a local folder and
an S3 bucket on a real S3 server process (moto's server mode, tests/storage_server.py).

Sizes are small but the S3 store's parts are S3's smallest (5 MiB), so a 20 MB file really goes
up in four parallel parts and a streamed body in parts of its own."""

from __future__ import annotations

import hashlib
import os
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from full_disk import small_disk
from storage_server import s3_server as private_s3_server

from api.storage import (
    ChecksumMismatch,
    InvalidKey,
    InvalidRange,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    StorageUnavailable,
    open_store,
)
from api.storage.keys import PARTIAL_MARK
from api.storage.local import LocalStore

MiB = 1024 * 1024
# Parts of 5 MiB, few in flight, and a lost server noticed in about a second.
S3_TUNING = {"part_bytes": 5 * MiB, "stream_part_bytes": 5 * MiB, "concurrency": 2, "max_attempts": 2,
             "connect_timeout": 2, "read_timeout": 10}


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    server = request.getfixturevalue("s3_server")  # the session's: each test has a prefix of its own
    return open_store(server.url(f"t-{uuid.uuid4().hex}"), env=server.env, **S3_TUNING)


def random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_goes_up_and_comes_back_whole_with_its_digest(store: ObjectStore, tmp_path: Path) -> None:
    data = random_file(tmp_path / "weights.bin", 300_000)
    written = store.put_file("jobs/7/model/weights.bin", tmp_path / "weights.bin")
    assert (written.key, written.size) == ("jobs/7/model/weights.bin", len(data))
    assert written.sha256 == sha256(data)
    assert store.stat("jobs/7/model/weights.bin") == written
    assert abs(written.modified - time.time()) < 60

    got = store.get_file("jobs/7/model/weights.bin", tmp_path / "out" / "copy.bin")
    assert (tmp_path / "out" / "copy.bin").read_bytes() == data and got == written
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["copy.bin"]  # no temporary left


def test_ranged_and_whole_reads_stream_the_right_bytes(store: ObjectStore) -> None:
    data = bytes(range(256)) * 10_000  # 2.56 MB: several chunks
    store.put_stream("files/file-1", [data[:1000], data[1000:]])
    with store.open_read("files/file-1") as whole:
        assert (whole.start, whole.length, whole.info.size) == (0, len(data), len(data))
        assert b"".join(whole) == data
    with store.open_read("files/file-1", start=5, length=300) as part:
        assert (part.start, part.length, part.info.sha256) == (5, 300, sha256(data))
        assert b"".join(part) == data[5:305]
    with store.open_read("files/file-1", start=len(data) - 10, length=1000) as tail:
        assert tail.length == 10 and b"".join(tail) == data[-10:]
    for start, length in ((len(data), None), (-1, None), (0, 0)):
        with pytest.raises(InvalidRange):
            store.open_read("files/file-1", start=start, length=length)


def test_a_large_file_goes_up_in_parallel_parts_and_is_checked(store: ObjectStore, tmp_path: Path) -> None:
    data = random_file(tmp_path / "big.bin", 20 * 1000 * 1000)
    written = store.put_file("big.bin", tmp_path / "big.bin")
    assert (written.size, written.sha256) == (len(data), sha256(data))
    if hasattr(store, "client"):  # S3 tags a multipart upload's ETag with its part count
        head = store.client.head_object(Bucket=store.bucket, Key=store.prefix + "big.bin")
        assert head["ETag"].strip('"').endswith("-4"), head["ETag"]
    store.get_file("big.bin", tmp_path / "back.bin")
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).hexdigest() == sha256(data)


def test_a_stream_is_stored_without_holding_its_body(store: ObjectStore) -> None:
    """64 MiB from a generator; the Python memory peak while it is stored stays well under half
    of it (the S3 store holds at most `concurrency` parts of 5 MiB)."""
    block = os.urandom(MiB)
    digest = hashlib.sha256()
    for _ in range(64):
        digest.update(block)

    def body() -> Iterator[bytes]:
        for _ in range(64):
            yield bytes(block)  # a fresh chunk each time, as a request body's are

    tracemalloc.start()
    try:
        written = store.put_stream("uploads/big.jsonl", body())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (written.size, written.sha256) == (64 * MiB, digest.hexdigest())
    assert store.stat("uploads/big.jsonl").sha256 == digest.hexdigest()
    assert peak < 32 * MiB, f"peak {peak / MiB:.1f} MiB while storing a 64 MiB stream"


def test_a_failed_stream_leaves_the_previous_object(store: ObjectStore) -> None:
    store.put_stream("a/b", [b"old"])

    def broken() -> Iterator[bytes]:
        yield b"x" * 1000
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        store.put_stream("a/b", broken())
    with pytest.raises(FileNotFoundError):  # the caller's missing file is not a missing object
        store.put_file("a/b", Path("/nonexistent/file"))
    assert b"".join(store.open_read("a/b")) == b"old"
    assert [info.key for info in store.list("a")] == ["a/b"]


def make_checkpoint(folder: Path) -> dict[str, bytes]:
    files = {"model.safetensors": os.urandom(200_000), "optimizer.pt": os.urandom(50_000),
             "tokenizer/tokenizer.json": b"{}", "trainer_state.json": b'{"step": 5}'}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def test_a_folder_goes_up_with_its_mark_last_and_comes_back_whole(store: ObjectStore, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    files = make_checkpoint(tmp_path / "step-5")
    batches: list[list[str]] = []
    put_files = store._put_files
    monkeypatch.setattr(store, "_put_files", lambda pairs: (batches.append([k for k, _ in pairs]),
                                                            put_files(pairs))[1])
    stored = store.put_folder("jobs/3/checkpoints/step-5", tmp_path / "step-5", last=["trainer_state.json"])
    assert stored == sum(len(data) for data in files.values())
    assert batches[-1] == ["jobs/3/checkpoints/step-5/trainer_state.json"]
    assert "jobs/3/checkpoints/step-5/trainer_state.json" not in batches[0]

    fetched = store.get_folder("jobs/3/checkpoints/step-5/", tmp_path / "cache" / "step-5")
    assert fetched == stored
    assert {p.relative_to(tmp_path / "cache" / "step-5").as_posix(): p.read_bytes()
            for p in (tmp_path / "cache" / "step-5").rglob("*") if p.is_file()} == files
    assert os.listdir(tmp_path / "cache") == ["step-5"]
    with pytest.raises(FileExistsError):
        store.get_folder("jobs/3/checkpoints/step-5", tmp_path / "cache" / "step-5")
    assert os.listdir(tmp_path / "cache") == ["step-5"]  # the second copy was removed
    with pytest.raises(ObjectNotFound):
        store.get_folder("jobs/3/checkpoints/step-6", tmp_path / "cache" / "step-6")


def test_a_folder_with_a_link_out_of_it_is_refused(store: ObjectStore, tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "step-1")
    (tmp_path / "secret").write_text("another team's")
    (tmp_path / "step-1" / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(ValueError, match="symbolic link"):
        store.put_folder("jobs/1/checkpoints/step-1", tmp_path / "step-1")
    assert list(store.list("jobs")) == []


def test_listing_and_deleting_by_prefix_keep_to_the_folder(store: ObjectStore) -> None:
    for key in ("jobs/1/a", "jobs/1/b/c", "jobs/12/a", "jobs/2/x", "files/f"):
        store.put_stream(key, [key.encode()])
    assert [(i.key, i.size) for i in store.list("jobs/1")] == [("jobs/1/a", 8), ("jobs/1/b/c", 10)]
    assert [i.key for i in store.list()] == ["files/f", "jobs/1/a", "jobs/1/b/c", "jobs/12/a", "jobs/2/x"]
    assert list(store.list("nothing/here")) == []
    assert sorted(store.folders("jobs")) == ["1", "12", "2"]  # not the objects in them
    assert sorted(store.folders()) == ["files", "jobs"] and list(store.folders("nothing")) == []

    assert store.delete_prefix("jobs/1") == 2
    assert [i.key for i in store.list("jobs")] == ["jobs/12/a", "jobs/2/x"]
    store.delete("jobs/2/x")
    store.delete("jobs/2/x")  # gone already: a retried deletion succeeds
    assert store.delete_prefix("jobs/404") == 0
    assert [i.key for i in store.list()] == ["files/f", "jobs/12/a"]
    assert not store.exists("jobs/2/x") and store.exists("files/f")
    with pytest.raises(InvalidKey):
        store.delete_prefix("")  # never the whole store


def test_a_missing_object_is_object_not_found(store: ObjectStore, tmp_path: Path) -> None:
    store.put_stream("jobs/1/model/config.json", [b"{}"])
    for missing in ("jobs/1/model/nope", "jobs/1/model"):  # a folder of objects is no object
        with pytest.raises(ObjectNotFound) as caught:
            store.stat(missing)
        assert caught.value.key == missing
        with pytest.raises(ObjectNotFound):
            store.open_read(missing)
        with pytest.raises(ObjectNotFound):
            store.get_file(missing, tmp_path / "dest")
        assert not (tmp_path / "dest").exists()


BAD_KEYS = ["", "/etc/passwd", "../outside", "jobs/../../outside", "jobs//1", "jobs/./1", "jobs/1/",
            "a\\b", "a\x00b", "a/.x.grpo-partial-123", "k" * 1025]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_keys_that_could_escape_or_collide_are_refused(store: ObjectStore, tmp_path: Path, key: str) -> None:
    for attempt in (lambda: store.put_stream(key, [b"x"]), lambda: store.stat(key),
                    lambda: store.get_file(key, tmp_path / "d"), lambda: store.delete(key),
                    lambda: store.open_read(key), lambda: store.put_file(key, Path(__file__))):
        with pytest.raises(InvalidKey):
            attempt()
    assert list(store.list()) == [] and not (tmp_path / "outside").exists()


def corrupt(store: ObjectStore, key: str) -> None:
    """Record a digest that is not the object's, as a corrupted copy would show."""
    wrong = "0" * 64
    if isinstance(store, LocalStore):
        from api.storage.local import _DIGEST_ATTRIBUTE, _stamp

        path = store.root / key
        os.setxattr(path, _DIGEST_ATTRIBUTE, f"{wrong}:{_stamp(path.stat())}".encode())
    else:
        full = store.prefix + key
        store.client.copy_object(Bucket=store.bucket, Key=full,
                                 CopySource={"Bucket": store.bucket, "Key": full},
                                 Metadata={"sha256": wrong}, MetadataDirective="REPLACE")


def test_a_copy_that_does_not_match_its_digest_is_refused(store: ObjectStore, tmp_path: Path) -> None:
    store.put_stream("m/w.bin", [b"weights"])
    corrupt(store, "m/w.bin")
    with pytest.raises(ChecksumMismatch):
        store.get_file("m/w.bin", tmp_path / "w.bin")
    assert not (tmp_path / "w.bin").exists()
    assert not [name for name in os.listdir(tmp_path) if PARTIAL_MARK in name]


def test_a_local_file_changed_in_place_has_no_digest_rather_than_a_wrong_one(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_stream("a", [b"one"])
    (tmp_path / "a").write_bytes(b"two")  # the same inode, so its attribute stays
    assert store.stat("a").sha256 is None
    store.get_file("a", tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"two"


def test_a_lost_s3_server_is_storage_unavailable(tmp_path: Path) -> None:
    """Killed mid-session, the server refuses every connection: each operation says so as
    StorageUnavailable (retry later), not as a missing object or a generic error."""
    (tmp_path / "f").write_bytes(b"x" * 1000)
    with private_s3_server() as server:
        store = open_store(server.url("p"), env=server.env, **S3_TUNING)
        store.put_stream("a", [b"alive"])
        make_checkpoint(tmp_path / "step-1")
        server.kill()
        started = time.monotonic()
        for attempt in (lambda: store.stat("a"), lambda: store.open_read("a"),
                        lambda: store.get_file("a", tmp_path / "a"), lambda: list(store.list("")),
                        lambda: store.put_file("b", tmp_path / "f"), lambda: store.put_stream("c", [b"y"]),
                        lambda: store.delete("a"), lambda: store.delete_prefix("p"),
                        lambda: store.put_folder("ck", tmp_path / "step-1"),
                        lambda: store.get_folder("ck", tmp_path / "ck")):
            with pytest.raises(StorageUnavailable):
                attempt()
        assert time.monotonic() - started < 60
        assert not (tmp_path / "a").exists() and not (tmp_path / "ck").exists()


def test_a_missing_bucket_is_a_storage_error_not_an_outage(s3_server) -> None:
    store = open_store("s3://no-such-bucket/x", env=s3_server.env, **S3_TUNING)
    with pytest.raises(StorageError) as caught:
        store.put_stream("a", [b"x"])
    assert not isinstance(caught.value, StorageUnavailable | ObjectNotFound)


def test_a_full_local_disk_is_storage_unavailable_and_leaves_nothing(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 1024 * 1024) as disk:
        store = LocalStore(disk.path)
        store.put_stream("kept", [b"before"])
        disk.fill()
        with pytest.raises(StorageUnavailable):
            store.put_stream("jobs/1/model/w", [b"z" * 65536] * 8)
        disk.free()
        assert [i.key for i in store.list()] == ["kept"]
        assert b"".join(store.open_read("kept")) == b"before"


@pytest.mark.parametrize(("status", "code", "expected"), [
    (503, "SlowDown", StorageUnavailable), (500, "InternalError", StorageUnavailable),
    (502, "BadGateway", StorageUnavailable), (400, "RequestTimeout", StorageUnavailable),
    (404, "NoSuchKey", ObjectNotFound), (404, "404", ObjectNotFound), (416, "InvalidRange", InvalidRange),
    (404, "NoSuchBucket", StorageError), (403, "AccessDenied", StorageError),
])
def test_s3_answers_are_told_apart_by_status_and_code(status: int, code: str, expected: type) -> None:
    """The answers a live server would give only under load or misconfiguration."""
    from botocore.exceptions import ClientError

    from api.storage.s3_errors import translated_client_error

    answer = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    error = ClientError(answer, "GetObject")
    assert type(translated_client_error(error, "k")) is expected
