"""``grpo health scheduler|worker`` (the compose health checks) against real Redis: unhealthy
until the process it probes publishes (a fresh scheduler pass; this host's worker heartbeat),
healthy after, unhealthy again once that goes stale."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import redis

from api.cli.main import main
from api.settings import get_settings
from api.store import bus
from api.store.tables import utcnow
from api.vocabulary import Heartbeat


@pytest.fixture
def health(api_server, monkeypatch, capsys):
    """``health(role) -> (exit code, stdout + stderr)`` with the module server's settings."""
    settings = api_server.settings
    for name, value in {"GRPO_DATABASE_URL": settings.database_url, "GRPO_REDIS_URL": settings.redis_url,
                        "GRPO_NAMESPACE": settings.namespace}.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()

    def run(role: str) -> tuple[int, str]:
        code = main(["health", role])
        out, err = capsys.readouterr()
        return code, out + err

    yield run
    get_settings.cache_clear()


def test_the_scheduler_is_healthy_while_its_passes_are_fresh(health, api_server) -> None:
    settings = api_server.settings
    client = redis.Redis.from_url(settings.redis_url)
    client.delete(settings.redis_keys.scheduler_pass)
    assert health("scheduler") == (1, "unhealthy: no scheduler pass yet\n")
    bus.mark_scheduler_pass(client, settings.redis_keys, utcnow().isoformat())
    assert health("scheduler") == (0, "healthy\n")
    bus.mark_scheduler_pass(client, settings.redis_keys, (utcnow() - timedelta(minutes=5)).isoformat())
    code, said = health("scheduler")
    assert code == 1 and "no scheduler pass for 300 s" in said


def test_the_worker_is_healthy_while_this_hosts_heartbeat_lives(health, api_server) -> None:
    settings = api_server.settings
    client = redis.Redis.from_url(settings.redis_url)
    code, said = health("worker")
    assert code == 1 and f"no live worker heartbeat from host {socket.gethostname()}" in said
    elsewhere = Heartbeat(worker_id="other:1", hostname="another-host")
    bus.advertise_worker(client, settings.redis_keys, elsewhere, 30)
    assert health("worker")[0] == 1  # another host's worker is not this one
    here = Heartbeat(worker_id=f"{socket.gethostname()}:7", hostname=socket.gethostname())
    bus.advertise_worker(client, settings.redis_keys, here, 30)
    assert health("worker") == (0, "healthy\n")
    client.delete(settings.redis_keys.worker(here.worker_id), settings.redis_keys.worker(elsewhere.worker_id))
