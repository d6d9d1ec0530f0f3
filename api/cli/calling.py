"""One ``grpo`` client command against the API: a client of the API's URL, what it prints, and
the exit code. Exit codes: 0 ok; 1 the job failed or was cancelled, or no API answered (the
message says how one is started), or the key was refused (it says which options carry a key);
2 bad input (the API answered 400/404/409/413/422, or an argument is wrong). A failure is one
line on stderr (the API's ``error.message`` and ``param``; one line for each invalid field when
the API lists several) and, with ``--json``, one document on stdout: the API's error body, or one
of its shape when no API answered.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.cli.printable import printable

BAD_INPUT_STATUSES = (400, 404, 409, 413, 422)


@dataclass
class Result:
    document: Any  # what --json prints: the API's JSON
    text: str  # what is printed otherwise
    code: int = 0


Command = Callable[[Any], Result]  # (ApiClient) -> what to print


class BadArgument(Exception):  # noqa: N818 - it names the condition
    """An argument the API could not refuse itself (a metric no step has): exit 2."""


def call_api(url: str, api_key: str | None, as_json: bool, command: Command) -> int:
    """Run ``command`` with a client of the API at ``url``; print its result; the exit code. A
    failure is one line on stderr and, with ``--json``, its error document on stdout."""
    import httpx

    from api.cli.client import ApiClient, ApiError

    try:
        with ApiClient(url, api_key) as client:
            result = command(client)
    except ApiError as exc:
        # Status 0: no answer to report (a stream or a download that kept breaking off).
        code = "http_error" if exc.status else "connection_lost"
        document = exc.body if _is_error_body(exc.body) else error_document(code, str(exc))
        return _failed(f"{exc}{_key_hint(api_key) if exc.status == 401 else ''}", document, as_json,
                       2 if exc.status in BAD_INPUT_STATUSES else 1)
    except BadArgument as exc:
        return _failed(str(exc), error_document("invalid_argument", str(exc)), as_json, 2)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        message = f"--api-url {url!r}: {exc}"
        return _failed(message, error_document("invalid_argument", message, "--api-url"), as_json, 2)
    except httpx.TransportError as exc:
        message = f"cannot reach the API at {url}: {exc.__class__.__name__}: {exc}"
        return _failed(message + UNREACHABLE_HINT, error_document("api_unreachable", message), as_json, 1)
    if as_json:
        print(json.dumps(result.document, indent=2))
    elif result.text:
        print(printable(result.text), flush=True)
    return result.code


UNREACHABLE_HINT = ("; is the service running? `grpo dev` starts one on this machine, and --api-url "
                    "(GRPO_API_URL) names another")


def _key_hint(api_key: str | None) -> str:
    make = "`grpo admin create-key TEAM` makes one"
    if api_key is None:
        return f"; no API key was given: set GRPO_API_KEY or pass --api-key ({make})"
    return f"; the API refused the key from --api-key (or GRPO_API_KEY): check it ({make})"


def error_document(code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """A failure the API never answered, in the shape of the API's own error bodies."""
    return {"error": {"code": code, "message": message, "param": param}}


def _is_error_body(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


def _failed(message: str, document: Any, as_json: bool, code: int) -> int:
    if as_json:
        print(json.dumps(document, indent=2))
    for line in message.splitlines():  # one per error, when the API listed several
        print(f"error: {printable(line)}", file=sys.stderr)
    return code
