"""Where a registered verifier service answers and how to call it: what an admin registers by
name (in the service) or ``grpo train --verifier NAME=URL`` names locally. A spec names the
verifier, never a URL, so a job cannot make the worker call an address nobody vetted.

The auth secret is kept out of ``repr`` (and so out of logs and failure texts); only the request
itself carries it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["MAX_URL_LENGTH", "VerifierEndpoint", "check_verifier_url", "parse_verifier_option"]

MAX_URL_LENGTH = 2048


@dataclass(frozen=True)
class VerifierEndpoint:
    url: str
    auth_header: str | None = None  # the header's name, e.g. "Authorization"
    auth_secret: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0  # one HTTP request
    max_concurrency: int = 4  # requests in flight at once from one job process
    max_batch_size: int = 64  # rows per request

    def headers(self) -> dict[str, str]:
        if self.auth_header is None or self.auth_secret is None:
            return {}
        return {self.auth_header: self.auth_secret}


def check_verifier_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host and no user:password part (credentials
    go in the auth header, which is never shown); a ValueError saying what is wrong otherwise."""
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"a URL of at most {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise ValueError("the URL must not contain whitespace or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("the URL must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("the URL has no host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError("the URL must not carry credentials; register an auth header instead")
    return url


def parse_verifier_option(text: str) -> tuple[str, VerifierEndpoint]:
    """``NAME=URL`` (``grpo train --verifier``) as a name and an endpoint with default limits."""
    name, sep, url = text.partition("=")
    if not sep or not name:
        raise ValueError(f"'{text}' is not NAME=URL")
    return name, VerifierEndpoint(url=check_verifier_url(url))
