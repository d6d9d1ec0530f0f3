"""Object storage behind one interface: a local folder or an S3-compatible bucket, chosen by
``GRPO_STORAGE_URL`` (:func:`open_store`). Artifacts, checkpoints and uploaded files live here, so
the API and the workers need no shared disk. Torch-free and free of the service's frameworks: the
web process and the worker both import it, and it imports nothing of theirs (boto3 only when the
store is a bucket)."""

from api.storage.errors import (
    ChecksumMismatch,
    InvalidKey,
    InvalidRange,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from api.storage.interface import ObjectInfo, ObjectStore, ObjectStream
from api.storage.locations import Location, open_store, parse_location

__all__ = ["ChecksumMismatch", "InvalidKey", "InvalidRange", "Location", "ObjectInfo", "ObjectNotFound",
           "ObjectStore", "ObjectStream", "StorageError", "StorageUnavailable", "open_store",
           "parse_location"]
