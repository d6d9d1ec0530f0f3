"""Object keys: ``/``-separated relative names, checked before any store sees them, so that no
key reaches outside a local store's root (``..``, an absolute path) and every key names the same
object in every store (no empty or ``.`` segments, which a filesystem folds and S3 does not)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from api.storage.errors import InvalidKey

# S3's limit on a key, in UTF-8 bytes; the local store keeps the same so a key is portable.
MAX_KEY_BYTES = 1024
# A write in progress (a local temp file, a folder being filled): never a key of its own, so a
# listing never returns one and no key can collide with one.
PARTIAL_MARK = ".grpo-partial-"
_BAD_CHARACTERS = re.compile(r"[\x00-\x1f\x7f\\]")


def checked_key(key: str) -> str:
    """``key`` if it names an object; else :class:`InvalidKey` saying why."""
    if not isinstance(key, str) or not key:
        raise InvalidKey("an object key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidKey(f"object key longer than {MAX_KEY_BYTES} bytes: '{key[:60]}…'")
    if key.startswith("/"):
        raise InvalidKey(f"object key '{key}' is absolute; keys are relative to the store")
    if _BAD_CHARACTERS.search(key):
        raise InvalidKey(f"object key {key!r} holds a control character or a backslash")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(f"object key '{key}' has an empty, '.' or '..' segment")
        if PARTIAL_MARK in segment:
            raise InvalidKey(f"object key '{key}' uses the reserved name '{PARTIAL_MARK}…'")
    return key


def checked_prefix(prefix: str, *, allow_root: bool = False) -> str:
    """A folder of keys as ``a/b/`` (a trailing ``/`` optional on input), so that ``jobs/1``
    never matches ``jobs/12/…``; ``""`` (every key) only where ``allow_root``."""
    if prefix in ("", "/") and allow_root:
        return ""
    return checked_key(prefix.removesuffix("/")) + "/"


def partial_path(path: Path) -> Path:
    """A temporary name beside ``path`` for a write that is renamed to ``path`` once whole."""
    return path.parent / f".{path.name}{PARTIAL_MARK}{uuid.uuid4().hex}"


FILES_DIR = "files"


def file_key(file_id: str) -> str:
    """Where an uploaded file's bytes live (``POST /v1/files``); the worker reads them by it."""
    return checked_key(f"{FILES_DIR}/{file_id}")
