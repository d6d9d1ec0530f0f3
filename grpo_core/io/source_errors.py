"""Telling a source that cannot be reached from a source that is wrong.

transformers and datasets wrap whatever failed (offline mode, a refused connection, a timeout) in
an OSError or their own types; the cause chain still holds it, named by class. A hub id that does
not exist is the spec's fault (``invalid_spec``); a hub that cannot be reached is not
(``source_unavailable``): the same job may load once the network is back.
"""

from __future__ import annotations

# Names, not imports: requests, httpx and huggingface_hub each raise their own, and none of them
# need be importable here.
_UNREACHABLE = frozenset({
    "LocalEntryNotFoundError",  # not cached and the hub could not be asked (offline or unreachable)
    "OfflineModeIsEnabled",
    "ConnectionError",  # the builtin and requests'
    "ConnectTimeout",
    "ReadTimeout",
    "Timeout",
    "TimeoutError",
    "ConnectError",  # httpx
    "TimeoutException",
    "NetworkError",
})
_UNREACHABLE_TEXT = ("couldn't connect to", "offline mode is enabled", "cannot reach", "name resolution")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` or anything in its cause chain says the source could not be reached."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ in _UNREACHABLE for cls in type(current).__mro__):
            return True
        if any(text in str(current).lower() for text in _UNREACHABLE_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False
