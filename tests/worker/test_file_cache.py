"""Uploaded files on a worker host (worker.file_cache), read from a real local store: a second
use downloads nothing, the least recently used entries not in use are evicted to stay under the
byte bound, a corrupt object is refused and kept nowhere, and a model archive unpacks only when
every member is a plain file inside its folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from api.storage import ChecksumMismatch
from api.storage.local import LocalStore
from worker.file_cache import FileCache, UnsafeArchive, uploaded_file_id


class CountingStore(LocalStore):
    downloads = 0

    def get_file(self, key: str, path: Path):
        self.downloads += 1
        return super().get_file(key, path)


def upload(store: LocalStore, tmp_path: Path, file_id: str, data: bytes) -> None:
    source = tmp_path / f"upload-{file_id}"
    source.write_bytes(data)
    store.put_file(f"files/{file_id}", source)


def model_archive(members: dict[str, bytes], link: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buffer.getvalue()


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "bucket")


def test_a_file_source_names_its_id() -> None:
    assert uploaded_file_id("file:file-abc") == "file-abc"
    assert uploaded_file_id("path:tiny") is None


def test_a_second_job_downloads_nothing_and_equal_bytes_share_one_entry(store, tmp_path: Path) -> None:
    upload(store, tmp_path, "file-a", b'{"prompt": "hi"}\n')
    upload(store, tmp_path, "file-b", b'{"prompt": "hi"}\n')  # the same bytes uploaded again
    cache = FileCache(store, tmp_path / "cache", 1 << 20)
    first = cache.dataset("file-a")
    assert first.read_bytes() == b'{"prompt": "hi"}\n' and store.downloads == 1
    assert cache.dataset("file-a") == first and cache.dataset("file-b") == first
    assert store.downloads == 1


def test_a_model_archive_unpacks_once(store, tmp_path: Path) -> None:
    archive = model_archive({"tiny/config.json": b"{}", "tiny/model.safetensors": b"w"})
    upload(store, tmp_path, "file-m", archive)
    cache = FileCache(store, tmp_path / "cache", 1 << 20)
    folder = cache.model("file-m")
    assert (folder / "tiny" / "config.json").read_bytes() == b"{}"
    assert cache.model("file-m") == folder and store.downloads == 1


@pytest.mark.parametrize("members, link", [({"../escape.json": b"{}"}, None), ({"/abs.json": b"{}"}, None),
                                           ({"config.json": b"{}"}, "tokenizer.json")])
def test_an_unsafe_archive_is_refused_and_kept_nowhere(store, tmp_path: Path, members, link) -> None:
    upload(store, tmp_path, "file-x", model_archive(members, link))
    cache = FileCache(store, tmp_path / "cache", 1 << 20)
    with pytest.raises(UnsafeArchive):
        cache.model("file-x")
    assert list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "escape.json").exists()


def test_least_recently_used_entries_not_in_use_are_evicted(store, tmp_path: Path) -> None:
    for name in "abc":
        upload(store, tmp_path, f"file-{name}", name.encode() * 400)
    cache = FileCache(store, tmp_path / "cache", 1000)
    a = cache.dataset("file-a")
    b = cache.dataset("file-b")
    os.utime(a.parent, (1, 1))  # a used longest ago
    c = cache.dataset("file-c")  # 1200 bytes: over the bound, but a and b are this job's
    assert a.exists() and b.exists()
    cache.release()  # the job ended
    upload(store, tmp_path, "file-d", b"d" * 400)
    d = cache.dataset("file-d")
    # Room for d under 1000 bytes: the two used longest ago went, the newest stayed.
    assert (a.exists(), b.exists(), c.exists(), d.exists()) == (False, False, True, True)


def test_a_corrupt_object_is_a_checksum_mismatch_and_kept_nowhere(store, tmp_path: Path) -> None:
    upload(store, tmp_path, "file-a", b"x" * 100)
    stored = tmp_path / "bucket" / "files" / "file-a"
    before = stored.stat()
    stored.write_bytes(b"y" * 100)  # bit rot: same size and time, other bytes
    os.utime(stored, ns=(before.st_atime_ns, before.st_mtime_ns))
    cache = FileCache(store, tmp_path / "cache", 1 << 20)
    with pytest.raises(ChecksumMismatch):
        cache.dataset("file-a")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_model_is_budgeted_by_its_unpacked_size(store, tmp_path: Path) -> None:
    upload(store, tmp_path, "file-a", b"a" * 300)
    archive = model_archive({"config.json": b"{}", "model.safetensors": bytes(900)})  # ~200 bytes packed
    assert len(archive) < 400
    upload(store, tmp_path, "file-m", archive)
    cache = FileCache(store, tmp_path / "cache", 1200)
    older = cache.dataset("file-a")
    cache.release()
    folder = cache.model("file-m")  # 300 + ~200 packed fits in 1200; 300 + ~200 + 900 unpacked does not
    assert (folder / "model.safetensors").stat().st_size == 900
    assert not older.exists()


def test_an_oversize_extended_header_is_refused_before_it_is_read(store, tmp_path: Path) -> None:
    import gzip

    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, 64 * 2**20
    upload(store, tmp_path, "file-l", gzip.compress(header.tobuf(format=tarfile.GNU_FORMAT)
                                                     + bytes(header.size) + bytes(1024)))
    cache = FileCache(store, tmp_path / "cache", 1 << 30)
    with pytest.raises(UnsafeArchive, match="long name or link header of 67108864 bytes"):
        cache.model("file-l")
    assert list((tmp_path / "cache").iterdir()) == []
