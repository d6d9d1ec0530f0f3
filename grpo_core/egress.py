"""The one egress guard: every outbound request a tenant can aim (a webhook; an environment server's
session: :func:`connect_checked`) goes through it, so a team cannot turn our network position against
the operator (OWASP's SSRF prevention; Smokescreen's design).

Resolve once, check the address against the policy, connect to that address: :func:`resolve_checked`
turns a URL's host into one checked IP, and :class:`EgressTransport` (an httpx transport) connects
only to that IP, never resolving again between check and connect (a name that answers a public
address to the check and a private one to the connect, DNS rebinding, gains nothing). The URL's
host still goes in the ``Host`` header and names the TLS certificate we check (SNI). Redirects are
never followed (httpx does not unless asked, and the transport never asks).

Only public unicast addresses pass: loopback, private (RFC 1918), shared (CGNAT, 100.64/10),
link-local (every cloud's metadata address: 169.254.169.254, ``fd00:ec2::254``), unspecified,
multicast, broadcast, reserved, IPv6 unique-local and site-local are refused, and so is the IPv4
address inside an IPv4-mapped, -compatible, NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address when
it would be. Every spelling of an address is caught because the check is on what the resolver
returns (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1`` and ``0`` all resolve to the
address they spell); a percent-encoded host is refused outright, and a trailing dot is dropped
(the same name). The operator may allow named networks (:class:`EgressPolicy`), for receivers
inside their own network, and for tests on loopback.

The transport also bounds the whole request: one deadline for connect, send and receive, every
socket operation clamped to what is left of it, so a peer trickling a byte at a time is cut at
the deadline (per-read timeouts never fire on it). One connection per request (no keep-alive), so
the deadline starts at each request's connect.

Standard library, httpx and httpcore only: a foundation of ``grpo_core`` the service uses too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import time
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_BROADCAST = ipaddress.ip_address("255.255.255.255")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_PRIVATE_V4 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
# Rules in the order they are named to the caller: the first that matches is the reason.
_RULES: tuple[tuple[str, Callable[[Address], bool]], ...] = (
    ("unspecified", lambda a: a.is_unspecified),
    ("loopback", lambda a: a.is_loopback),
    ("link-local (cloud metadata)", lambda a: a.is_link_local),
    ("private", lambda a: any(a in n for n in _PRIVATE_V4) if a.version == 4 else a in _UNIQUE_LOCAL),
    ("shared address space (CGNAT)", lambda a: a in _SHARED),
    ("site-local", lambda a: a in _SITE_LOCAL),
    ("multicast", lambda a: a.is_multicast),
    ("broadcast", lambda a: a == _BROADCAST),
    ("reserved", lambda a: a.is_reserved or a.is_private),
    ("not a public address", lambda a: not a.is_global),
)


class DestinationRefused(Exception):  # noqa: N818 - a refusal, not a failure of ours
    """The destination is not one the policy lets us reach; ``rule`` says why."""

    def __init__(self, host: str, rule: str) -> None:
        super().__init__(f"destination not allowed: {host} is {rule}")
        self.host = host
        self.rule = rule


class Unresolved(Exception):  # noqa: N818
    """The host has no address (yet): nothing to check and nothing to reach."""


@dataclass(frozen=True)
class EgressPolicy:
    """Public unicast addresses, plus ``allowed``: the operator's named networks."""

    allowed: tuple[Network, ...] = ()

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str]) -> EgressPolicy:
        """From CIDR texts (``ValueError`` naming a bad one)."""
        return cls(tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip()))


def embedded_v4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4), if any."""
    if address.version == 4:
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = int(address)
    if address in _NAT64 or (packed >> 32 == 0 and packed > 1):  # NAT64, or ::a.b.c.d (compatible)
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    return None


def refusal(address: Address | str, policy: EgressPolicy) -> str | None:
    """The rule that refuses ``address`` under ``policy``; None when it may be reached."""
    address = ipaddress.ip_address(address)
    inner = embedded_v4(address)
    reached = [a for a in (address, inner) if a is not None]
    if any(a in n for a in reached for n in policy.allowed if a.version == n.version):
        return None
    # An address carrying an IPv4 one reaches that one (mapped, NAT64, 6to4): it is what counts.
    for rule, matches in _RULES:
        if matches(inner or address):
            return rule if inner is None else f"{rule} (the IPv4 address {inner} inside)"
    return None


def check_address(address: Address | str, policy: EgressPolicy) -> None:
    """Raise :class:`DestinationRefused` unless ``address`` may be reached."""
    rule = refusal(address, policy)
    if rule is not None:
        raise DestinationRefused(str(address), rule)


def _system_resolver(host: str, port: int) -> list[str]:
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def resolve_checked(host: str, port: int, policy: EgressPolicy,
                    resolver: Resolver = _system_resolver) -> str:
    """The one address to connect to for ``host``: resolved once, every address it has checked
    (one refused address refuses the name: which one a client would pick is not ours to bet on).
    :class:`DestinationRefused` or :class:`Unresolved`."""
    if "%" in host:  # percent-encoding, or an IPv6 zone: never a public destination
        raise DestinationRefused(host, "percent-encoded")
    name = host.strip("[]")
    name = name[:-1] if name.endswith(".") else name
    try:
        addresses = list(dict.fromkeys(resolver(name, port)))
    except (OSError, UnicodeError) as exc:
        raise Unresolved(host) from exc
    if not addresses:
        raise Unresolved(host)
    for address in addresses:
        rule = refusal(address, policy)
        if rule is not None:
            raise DestinationRefused(host, rule)
    return addresses[0]


@contextlib.contextmanager
def _mapped(errors: dict[type[Exception], type[Exception]]) -> typing.Iterator[None]:
    """Socket errors as the httpcore errors httpx maps to its own (timeouts first: one is an OSError)."""
    try:
        yield
    except Exception as exc:
        for source, target in errors.items():
            if isinstance(exc, source):
                raise target(exc) from exc
        raise


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every operation is clamped to what is left of one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def _left(self, timeout: float | None, expired: type[Exception]) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise expired("the request's deadline passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _mapped({socket.timeout: httpcore.ReadTimeout,
                                                   OSError: httpcore.ReadError}):
            self._sock.settimeout(self._left(timeout, httpcore.ReadTimeout))
            return self._sock.recv(max_bytes)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with _mapped({socket.timeout: httpcore.WriteTimeout,
                                                   OSError: httpcore.WriteError}):
            while buffer:
                self._sock.settimeout(self._left(timeout, httpcore.WriteTimeout))
                buffer = buffer[self._sock.send(buffer):]

    def close(self) -> None:
        self._sock.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        with _mapped({socket.timeout: httpcore.ConnectTimeout,
                                                   OSError: httpcore.ConnectError}):
            try:
                self._sock.settimeout(self._left(timeout, httpcore.ConnectTimeout))
                # server_hostname is the URL's host: SNI and the certificate check name it.
                wrapped = ssl_context.wrap_socket(self._sock, server_hostname=server_hostname)
            except BaseException:
                self.close()
                raise
        return _DeadlineStream(wrapped, self._deadline)

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "ssl_object" and isinstance(self._sock, ssl.SSLSocket):
            return self._sock._sslobj  # noqa: SLF001 - what httpcore's own stream answers
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "socket":
            return self._sock
        return None


def _connected(address: str, port: int, timeout: float) -> socket.socket:
    sock = socket.create_connection((address, port), timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def connect_checked(host: str, port: int, policy: EgressPolicy, timeout: float,
                    resolver: Resolver = _system_resolver) -> socket.socket:
    """A TCP socket connected to ``host``'s checked address (for a protocol httpx does not speak:
    an environment server's WebSocket). :class:`DestinationRefused`, :class:`Unresolved`, or the
    ``OSError`` of the connect."""
    return _connected(resolve_checked(host, port, policy, resolver), port, timeout)


class _GuardedBackend(httpcore.NetworkBackend):
    """Connects only to the checked address of the host it is asked for."""

    def __init__(self, policy: EgressPolicy, deadline_seconds: float, resolver: Resolver) -> None:
        self.policy = policy
        self.deadline_seconds = deadline_seconds
        self.resolver = resolver

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        deadline = time.monotonic() + self.deadline_seconds
        try:
            address = resolve_checked(host, port, self.policy, self.resolver)
        except Unresolved as exc:
            raise httpcore.ConnectError(f"{host} does not resolve") from exc
        left = deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout("the request's deadline passed")
        with _mapped({socket.timeout: httpcore.ConnectTimeout,
                                                   OSError: httpcore.ConnectError}):
            sock = _connected(address, port, min(left, timeout or left))
        return _DeadlineStream(sock, deadline)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Any = None) -> httpcore.NetworkStream:
        raise DestinationRefused(path, "a local socket")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class EgressTransport(httpx.HTTPTransport):
    """An httpx transport through the guard: each request connects afresh to its host's checked
    address and must end within ``deadline_seconds`` of its connect. Refused destinations raise
    :class:`DestinationRefused` from ``send`` before any packet leaves. No cap on connections: the
    caller bounds its requests in flight (a pool's cap would queue one caller's request behind
    another's slow ones)."""

    def __init__(self, policy: EgressPolicy, deadline_seconds: float, *,
                 resolver: Resolver = _system_resolver, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context or httpx.create_ssl_context(trust_env=False),
            max_connections=None, max_keepalive_connections=0, retries=0,
            network_backend=_GuardedBackend(policy, deadline_seconds, resolver))


def guarded_client(policy: EgressPolicy, deadline_seconds: float, **transport: typing.Any) -> httpx.Client:
    """An httpx client whose every request goes through the guard, no redirect followed, no proxy
    or ``.netrc`` from the environment."""
    return httpx.Client(transport=EgressTransport(policy, deadline_seconds, **transport),
                        timeout=deadline_seconds, follow_redirects=False, trust_env=False)
