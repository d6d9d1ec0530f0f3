"""Domain errors. They carry no HTTP knowledge: one handler in ``api/http/error_responses.py`` maps each
``code`` to a status, so the store and the worker can raise them freely."""

from __future__ import annotations


class ServiceError(Exception):
    code = "error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class NotFound(ServiceError):  # noqa: N818 - domain vocabulary
    code = "not_found"


class Conflict(ServiceError):  # noqa: N818
    code = "conflict"


class InvalidInput(ServiceError):  # noqa: N818
    code = "invalid_input"


class TooLarge(ServiceError):  # noqa: N818
    """A body (an upload) over the size the service accepts."""

    code = "request_too_large"


class TooSlow(ServiceError):  # noqa: N818
    """A body (an upload) that arrived slower than the service waits for."""

    code = "upload_too_slow"


class ClientGone(ServiceError):  # noqa: N818
    """The client closed its connection before its request was read: nothing to answer."""

    code = "client_closed_request"


class Unauthorized(ServiceError):  # noqa: N818
    code = "unauthorized"


class Forbidden(ServiceError):  # noqa: N818
    code = "forbidden"


class QueueFull(ServiceError):  # noqa: N818
    """The team already has as many jobs waiting as it may (its ``max_queued_jobs``)."""

    code = "queue_full"


class BudgetExhausted(ServiceError):  # noqa: N818
    """GPU-hours are used up: the team's budget for its period (``team.gpu_hours_budget``), or a
    job's own (``resources.max_gpu_hours``); a request that would start more GPU time is refused."""

    code = "budget_exhausted"


class QuotaExceeded(ServiceError):  # noqa: N818
    """What the team stores would go over its artifact byte quota (``teams.artifact_quota_bytes``);
    the worker fails a job with the same code when a checkpoint would."""

    code = "artifact_quota_exceeded"


class RateLimited(ServiceError):  # noqa: N818
    """The caller's team spent its request budget; ``retry_after`` seconds refill enough of it."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class Unavailable(ServiceError):  # noqa: N818
    """Something the request needs is missing for now (no capable worker answered): the client may
    try again after ``retry_after`` seconds."""

    code = "unavailable"

    def __init__(self, message: str, *, retry_after: float, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class SpoolFull(Unavailable):
    """The API host's disk for uploads in flight (``GRPO_UPLOAD_SPOOL_DIR``) is full: the service's
    condition, not the request's, and it clears as the uploads in flight end (a 503 to retry)."""

    code = "spool_full"
