"""``bus.connect``: a frozen Redis (SIGSTOP: it accepts nothing and answers nothing) fails a call
within a third of the lease, rather than hanging the thread that must renew the lease."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from api.settings import Settings
from api.store import bus


def test_timeouts_are_a_third_of_the_lease_and_a_stream_reader_outwaits_its_block() -> None:
    short = bus.client_timeouts(Settings(lease_seconds=6))
    assert (short.socket, short.connect, short.health_check) == (2.0, 2.0, 2.0)
    assert bus.client_timeouts(Settings(lease_seconds=3600)).socket == bus.MAX_SOCKET_TIMEOUT_S
    reader = bus.client_timeouts(Settings(lease_seconds=3, stream_block_seconds=5), blocking_read_seconds=5)
    assert reader.socket > 5  # an XREAD BLOCK 5 s is not taken for a dead socket


def test_a_frozen_redis_fails_a_call_within_the_socket_timeout(private_redis) -> None:
    url, process = private_redis
    settings = Settings(redis_url=url, lease_seconds=3)  # socket timeout 1 s
    client = bus.connect(settings)
    assert client.ping()
    os.kill(process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        bus.mark_scheduler_pass(client, settings.redis_keys, "2026-01-01T00:00:00+00:00")
    # Inside the lease (a health-check PING and the call: two timeouts at most); a client without
    # timeouts would still be waiting.
    assert time.monotonic() - started < settings.lease_seconds
    os.kill(process.pid, signal.SIGCONT)
    assert client.ping()  # and it recovers once Redis answers again


def test_the_schedulers_send_to_a_frozen_broker_fails_instead_of_hanging(private_redis) -> None:
    from kombu.exceptions import OperationalError

    from api.scheduling.scheduler import celery_client

    url, process = private_redis
    settings = Settings(redis_url=url, lease_seconds=3)
    sender = celery_client(settings)
    sender.send_task("grpo.probe", args=[1], queue=settings.redis_keys.worker_queue("w"))
    os.kill(process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(OperationalError):  # without timeouts this send waits for as long as Redis is frozen
        sender.send_task("grpo.probe", args=[2], queue=settings.redis_keys.worker_queue("w"))
    # Celery's publish retries each time out: a few timeouts, the tick fails and is retried.
    assert time.monotonic() - started < 4 * settings.lease_seconds
