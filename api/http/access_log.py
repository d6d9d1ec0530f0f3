"""Keeps credentials out of the server's logs. uvicorn logs each request's path with its query
string (``uvicorn.access``) and each WebSocket handshake's (``uvicorn.error``); a client that
puts a key or ticket in a URL anyway (an old dashboard, a hand-written ``curl``) would leave it
there in plain text. :class:`RedactCredentials` rewrites such values before any handler sees
the record: the values of credential-named query parameters, and anything shaped like an API
key wherever it appears."""

from __future__ import annotations

import logging
import re

REDACTED = "[redacted]"
# Parameter names as clients spell them; a name percent-encoded to dodge this would still have
# its key caught by the key-shape rule below.
_CREDENTIAL_PARAM = re.compile(r"(?i)([?&](?:token|ticket|access_token|api_key|apikey|key)=)[^&\s\"']*")
_KEY_SHAPE = re.compile(r"grpo_[A-Za-z0-9_-]{20,}")
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    return _KEY_SHAPE.sub(REDACTED, _CREDENTIAL_PARAM.sub(lambda m: m.group(1) + REDACTED, text))


class RedactCredentials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        return True


def install() -> None:
    """Attach the filter to uvicorn's loggers, once per process however many apps are built."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactCredentials) for f in logger.filters):
            logger.addFilter(RedactCredentials())
