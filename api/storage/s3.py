"""An S3-compatible bucket as an object store (AWS S3, MinIO, Ceph RGW, GCS's XML API), through
boto3: large files go up and down in parallel multipart transfers (s3transfer), a streamed body
in parts with only a few held at once. Keys live under the URL's prefix.

Every object carries its SHA-256 as the user metadata ``sha256`` (S3's own checksums are per
part for multipart uploads, not of the whole object). A file's digest is taken before its upload;
a stream's is known only at its end, so a streamed object is copied onto itself with the digest
added (server-side; no byte comes back through this process)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from s3transfer.manager import TransferConfig, TransferManager

from api.storage.digests import HashingReader, check_digest, file_sha256
from api.storage.interface import ObjectInfo, ObjectStore, ObjectStream, read_range
from api.storage.keys import checked_key, checked_prefix, partial_path
from api.storage.s3_errors import s3_errors, translated_client_error

MiB = 1024 * 1024
_DIGEST = "sha256"
_DELETE_BATCH = 1000  # S3's most keys in one DeleteObjects


def s3_client(env: Mapping[str, str], *, concurrency: int, max_attempts: int = 5,
              connect_timeout: float = 10, read_timeout: float = 60) -> Any:
    """A client configured by the standard ``AWS_*`` variables of ``env``. Credentials that are
    not set there come from boto3's usual chain (a profile, an instance or pod role)."""
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    session = boto3.session.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1")
    config = Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        connect_timeout=connect_timeout, read_timeout=read_timeout,
        max_pool_connections=max(10, 2 * concurrency),
        # MinIO, Ceph and most servers at an explicit endpoint serve buckets as paths, not hosts.
        s3={"addressing_style": "path" if endpoint else "auto"})
    return session.client("s3", endpoint_url=endpoint, config=config)


class S3Store(ObjectStore):
    def __init__(self, client: Any, bucket: str, prefix: str = "", *, part_bytes: int = 64 * MiB,
                 stream_part_bytes: int = 8 * MiB, concurrency: int = 8) -> None:
        """``part_bytes``: a file's multipart part size (S3 allows 10,000 parts: 640 GB at 64 MiB);
        ``stream_part_bytes``: a streamed body's, of which ``concurrency`` at most are in memory."""
        self.client, self.bucket = client, bucket
        self.prefix = checked_prefix(prefix, allow_root=True)
        self.concurrency = concurrency
        self._files = TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes,
                                     max_request_concurrency=concurrency)
        self._streams = TransferConfig(multipart_threshold=stream_part_bytes,
                                       multipart_chunksize=stream_part_bytes,
                                       max_request_concurrency=concurrency,
                                       max_in_memory_upload_chunks=concurrency)

    @classmethod
    def from_env(cls, bucket: str, prefix: str = "", env: Mapping[str, str] | None = None,
                 **tuning: Any) -> S3Store:
        env = os.environ if env is None else env
        concurrency = tuning.get("concurrency", 8)
        client_names = ("max_attempts", "connect_timeout", "read_timeout")
        client_tuning = {name: tuning.pop(name) for name in client_names if name in tuning}
        return cls(s3_client(env, concurrency=concurrency, **client_tuning), bucket, prefix, **tuning)

    def __repr__(self) -> str:
        return f"S3Store('s3://{self.bucket}/{self.prefix}')"

    def _full(self, key: str) -> str:
        return self.prefix + checked_key(key)

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        self._put_files([(key, Path(path))])
        return self.stat(key)

    def _put_files(self, pairs: list[tuple[str, Path]]) -> None:
        """All of them through one transfer manager: many files and their parts in parallel."""
        digests = [file_sha256(path) for _, path in pairs]
        with s3_errors(pairs[0][0] if pairs else ""), TransferManager(self.client, self._files) as manager:
            futures = [manager.upload(str(path), self.bucket, self._full(key),
                                      extra_args={"Metadata": {_DIGEST: digest}})
                       for (key, path), digest in zip(pairs, digests, strict=True)]
            for future in futures:
                future.result()

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> ObjectInfo:
        full, body = self._full(key), HashingReader(chunks)
        with s3_errors(key), TransferManager(self.client, self._streams) as manager:
            manager.upload(body, self.bucket, full).result()
            source = {"Bucket": self.bucket, "Key": full}
            manager.copy(source, self.bucket, full, extra_args={
                "Metadata": {_DIGEST: body.sha256()}, "MetadataDirective": "REPLACE"}).result()
        return self.stat(key)

    def get_file(self, key: str, path: Path) -> ObjectInfo:
        return self._download([(key, Path(path))])[0]

    def _get_files(self, pairs: list[tuple[str, Path]]) -> None:
        self._download(pairs)

    def _download(self, pairs: list[tuple[str, Path]]) -> list[ObjectInfo]:
        """Each object into a temporary file beside its path, checked, then renamed into place."""
        with ThreadPoolExecutor(self.concurrency) as pool:  # a checkpoint's files: one stat each
            infos = list(pool.map(self.stat, [key for key, _ in pairs]))
        temps = [partial_path(path) for _, path in pairs]
        try:
            label = infos[0].key if infos else ""
            with s3_errors(label), TransferManager(self.client, self._files) as manager:
                for temp in temps:
                    temp.parent.mkdir(parents=True, exist_ok=True)
                futures = [manager.download(self.bucket, self._full(key), str(temp))
                           for (key, _), temp in zip(pairs, temps, strict=True)]
                for future in futures:
                    future.result()
            for info, temp, (_, path) in zip(infos, temps, pairs, strict=True):
                check_digest(info.key, file_sha256(temp), info.sha256)
                os.replace(temp, path)
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)
        return infos

    def open_read(self, key: str, start: int = 0, length: int | None = None) -> ObjectStream:
        head = self._head(key)
        info = _info(key, head)
        start, length = read_range(info.size, start, length)
        ranged = {} if (start, length) == (0, info.size) else {"Range": f"bytes={start}-{start + length - 1}"}
        with s3_errors(key):
            # Pinned to the version stat saw: an object replaced meanwhile fails, never mixes two.
            response = self.client.get_object(Bucket=self.bucket, Key=self._full(key), IfMatch=head["ETag"],
                                              **ranged)
        body = response["Body"]
        return ObjectStream(info, start, length, _reading(key, body.iter_chunks(MiB)), body.close)

    def stat(self, key: str) -> ObjectInfo:
        return _info(key, self._head(key))

    def _head(self, key: str) -> dict[str, Any]:
        with s3_errors(key):
            return self.client.head_object(Bucket=self.bucket, Key=self._full(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = checked_prefix(prefix, allow_root=True)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                      Prefix=self.prefix + base)
        with s3_errors(base):
            for page in pages:
                for item in page.get("Contents", []):
                    yield ObjectInfo(item["Key"].removeprefix(self.prefix), item["Size"], None,
                                     item["LastModified"].timestamp())

    def folders(self, prefix: str = "") -> Iterator[str]:
        base = checked_prefix(prefix, allow_root=True)
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + base, Delimiter="/")
        with s3_errors(base):
            for page in pages:
                for common in page.get("CommonPrefixes", []):
                    yield common["Prefix"].removeprefix(self.prefix + base).removesuffix("/")

    def delete(self, key: str) -> None:
        with s3_errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def delete_prefix(self, prefix: str) -> int:
        base = checked_prefix(prefix)
        keys = [info.key for info in self.list(base)]
        for first in range(0, len(keys), _DELETE_BATCH):
            batch = keys[first:first + _DELETE_BATCH]
            with s3_errors(base):
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Quiet": True, "Objects": [{"Key": self.prefix + key} for key in batch]})
            if answer.get("Errors"):
                first_error = answer["Errors"][0]
                raise translated_client_error(ClientError({"Error": first_error}, "DeleteObjects"),
                                              first_error.get("Key", base))
        return len(keys)


def _info(key: str, head: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(key, head["ContentLength"], head.get("Metadata", {}).get(_DIGEST),
                      head["LastModified"].timestamp())


def _reading(key: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    with s3_errors(key):
        yield from chunks
