"""What a storage operation raises, told apart by what the caller should do about it:
wait and retry (:class:`StorageUnavailable`), treat as absent (:class:`ObjectNotFound`), or
report (every other :class:`StorageError`: a bad key, a corrupt copy, a misconfigured store)."""

from __future__ import annotations


class StorageError(Exception):
    """Anything the object store refused or could not do. Not worth retrying unless it is a
    :class:`StorageUnavailable`: a missing bucket or denied credentials stay so until an
    operator acts."""


class StorageUnavailable(StorageError):
    """The store could not be reached or answered that it is failing (connection refused, a
    timeout, a dropped connection, a 5xx or a throttle, a full or failing disk): an
    infrastructure fault, never the job's own; retry with backoff."""


class ObjectNotFound(StorageError):
    """No object under this key (or, for a folder, none under this prefix)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object '{key}' in storage")
        self.key = key


class InvalidKey(StorageError, ValueError):
    """A key or prefix that could name something outside the store or no object at all."""


class InvalidRange(StorageError, ValueError):
    """A ranged read that starts at or past the object's end."""


class ChecksumMismatch(StorageError):
    """A copy read back whose SHA-256 differs from the one recorded when it was written (a
    corrupt transfer, or the object replaced while it was read): the copy is discarded."""
