"""``grpo health scheduler|worker``: the container health checks of the processes that serve no
HTTP (the API's is ``/healthz``). Each asks Redis what the process itself publishes:

* scheduler: a pass stamped within :func:`api.scheduling.liveness.stale_after_seconds` in this
  deployment's namespace (a standby scheduler counts as healthy while the leader passes: the
  check is that jobs are being scheduled);
* worker: a live heartbeat from this host (one worker per host, so its container's hostname).

Exit 0 healthy, 1 not, with one line saying why.
"""

from __future__ import annotations

import argparse
import socket
import sys


def check_scheduler(settings, client) -> str | None:
    from api.scheduling import liveness

    age = liveness.pass_age_seconds(client.get(settings.redis_keys.scheduler_pass))
    if liveness.scheduler_alive(age, settings):
        return None
    return "no scheduler pass yet" if age is None else f"no scheduler pass for {age:.0f} s"


def check_worker(settings, client, hostname: str | None = None) -> str | None:
    from api.store.bus import live_workers

    hostname = hostname or socket.gethostname()
    if any(beat.hostname == hostname for beat in live_workers(client, settings.redis_keys)):
        return None
    return f"no live worker heartbeat from host {hostname}"


CHECKS = {"scheduler": check_scheduler, "worker": check_worker}


def run(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisError

    from api.settings import get_settings
    from api.store import bus

    settings = get_settings()
    client = bus.connect(settings)
    try:
        problem = CHECKS[args.role](settings, client)
    except RedisError as exc:
        problem = f"redis: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print("healthy")
    return 0


def add_health_command(commands: argparse._SubParsersAction) -> None:
    health = commands.add_parser("health", help="container health check of a scheduler or worker")
    health.add_argument("role", choices=sorted(CHECKS))
    health.set_defaults(handler=run)
