"""The egress guard's transport (:mod:`grpo_core.egress`) against a real local HTTP server: it
connects to the one address it checked (a resolver that changes its answer between a check and a
connect, DNS rebinding, gets nowhere), keeps the URL's host in ``Host``, follows no redirect, and
refuses a name with any refused address before a packet leaves."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest
from local_http import serving

from grpo_core.egress import DestinationRefused, EgressPolicy, guarded_client


def recording_server(seen: list[dict[str, str]], status: int = 204, location: str = ""):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(dict(self.headers))
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


class Resolver:
    """Answers each lookup with the next of ``answers``, counting lookups."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


LOOPBACK_ONE = EgressPolicy.from_cidrs(["127.0.0.1/32"])


def test_connects_to_the_checked_address_with_the_urls_host() -> None:
    seen: list[dict[str, str]] = []
    resolver = Resolver(["127.0.0.1"])
    with serving(recording_server(seen)) as port, \
            guarded_client(LOOPBACK_ONE, 5, resolver=resolver) as client:
        assert client.post(f"http://hooks.test:{port}/x", content=b"{}").status_code == 204
    assert seen[0]["Host"] == f"hooks.test:{port}" and resolver.calls == 1


def test_a_rebinding_name_reaches_only_the_address_that_was_checked() -> None:
    """The check sees 127.0.0.2 (allowed here), a second lookup would say 127.0.0.1 (refused, and
    where the server listens): the connect goes to 127.0.0.2, so nothing reaches the server."""
    seen: list[dict[str, str]] = []
    resolver = Resolver(["127.0.0.2"], ["127.0.0.1"])
    policy = EgressPolicy.from_cidrs(["127.0.0.2/32"])
    with serving(recording_server(seen)) as port, guarded_client(policy, 5, resolver=resolver) as client:
        with pytest.raises(httpx.ConnectError):
            client.post(f"http://rebinding.test:{port}/x", content=b"{}")
    assert seen == [] and resolver.calls == 1


def test_a_name_with_any_refused_address_is_refused_before_connecting() -> None:
    seen: list[dict[str, str]] = []
    with serving(recording_server(seen)) as port:
        for answer in (["127.0.0.1"], ["93.184.216.34", "127.0.0.1"], ["::ffff:127.0.0.1"]):
            with guarded_client(EgressPolicy(), 5, resolver=Resolver(answer)) as client, \
                    pytest.raises(DestinationRefused, match="loopback"):
                client.post(f"http://hooks.test:{port}/x", content=b"{}")
    assert seen == []


def test_a_redirect_is_an_answer_not_a_new_request() -> None:
    seen: list[dict[str, str]] = []
    other: list[dict[str, str]] = []
    with serving(recording_server(other)) as other_port, \
            serving(recording_server(seen, 307, f"http://127.0.0.1:{other_port}/in")) as port, \
            guarded_client(LOOPBACK_ONE, 5, resolver=Resolver(["127.0.0.1"])) as client:
        assert client.post(f"http://hooks.test:{port}/x", content=b"{}").status_code == 307
    assert len(seen) == 1 and other == []
