"""``GRPO_STORAGE_URL`` read: which store, where. ``s3://bucket/prefix`` is a bucket (its endpoint,
region and credentials from the standard ``AWS_*`` variables); a path or ``file://`` URL is a local
folder. Checked when the settings load, so a typo fails at start, not at the first checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from api.storage.interface import ObjectStore
from api.storage.keys import checked_prefix

# A bucket name as S3 allows it (3-63 lower-case letters, digits, dots and hyphens).
_BUCKET_CHARACTERS = set("abcdefghijklmnopqrstuvwxyz0123456789.-")


@dataclass(frozen=True)
class Location:
    scheme: str  # "s3" or "file"
    bucket: str  # "" for a folder
    prefix: str  # a bucket's key prefix ("" or "a/b/"); a folder's absolute path


def parse_location(url: str) -> Location:
    """ValueError naming what is wrong with ``url``."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not (3 <= len(bucket) <= 63 and set(bucket) <= _BUCKET_CHARACTERS):
            raise ValueError(f"'{url}': the bucket must be 3-63 lower-case letters, digits, '.' or '-'")
        return Location("s3", bucket, checked_prefix(parts.path.strip("/"), allow_root=True))
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"'{url}': a file URL names a local folder (file:///path)")
        return Location("file", "", str(Path(unquote(parts.path)).absolute()))
    if parts.scheme == "" and url:
        return Location("file", "", str(Path(url).absolute()))
    raise ValueError(f"'{url}': a storage URL is s3://bucket[/prefix], file:///path or a folder's path")


def open_store(url: str, env: Mapping[str, str] | None = None, **tuning: Any) -> ObjectStore:
    """The store ``url`` names; ``env`` (default: this process's environment) holds the ``AWS_*``
    variables; ``tuning`` goes to :class:`~api.storage.s3.S3Store` (part sizes, concurrency,
    retries, timeouts). boto3 is imported only for a bucket."""
    location = parse_location(url)
    if location.scheme == "s3":
        from api.storage.s3 import S3Store

        return S3Store.from_env(location.bucket, location.prefix, env, **tuning)
    from api.storage.local import LocalStore

    return LocalStore(Path(location.prefix))
