"""botocore's exceptions as this package's: what the caller should retry
(:class:`StorageUnavailable`), what is absent (:class:`ObjectNotFound`), and the rest. botocore
types its failures (a refused or dropped connection, a timeout, an HTTP status with S3's error
code), so no message text is ever parsed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from api.storage.errors import InvalidRange, ObjectNotFound, StorageError, StorageUnavailable

_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
# S3's own names for "slow down, try later"; any 5xx counts too.
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling",
                    "ThrottlingException", "RequestTimeTooSkewed", "503", "500"}


def translated_client_error(error: ClientError, key: str) -> StorageError:
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    if code in _NOT_FOUND_CODES:
        return ObjectNotFound(key)
    if code in ("InvalidRange", "416"):
        return InvalidRange(f"'{key}': {error}")
    if status >= 500 or code in _TRANSIENT_CODES:
        return StorageUnavailable(f"S3, '{key}': {error}")
    return StorageError(f"S3, '{key}': {error}")  # NoSuchBucket, AccessDenied, …: the operator's to fix


def translated(error: BaseException, key: str) -> BaseException:
    """The storage error ``error`` stands for, or ``error`` itself when it is none of botocore's."""
    if isinstance(error, ClientError):
        return translated_client_error(error, key)
    if isinstance(error, BotoConnectionError | HTTPClientError):
        return StorageUnavailable(f"S3 unreachable, '{key}': {error}")
    if isinstance(error, BotoCoreError):  # no credentials, a bad endpoint URL: configuration
        return StorageError(f"S3, '{key}': {error}")
    return error


@contextmanager
def s3_errors(key: str) -> Iterator[None]:
    try:
        yield
    except (BotoCoreError, ClientError) as error:
        raise translated(error, key) from error
