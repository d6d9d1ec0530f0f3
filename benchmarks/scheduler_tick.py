"""Time of one whole scheduler tick against real Postgres and Redis: reap leases, read the
cluster from SQL and heartbeats, ``plan()``, dispatch, write pending reasons, publish the queue.

Usage:
    .venv/bin/python benchmarks/scheduler_tick.py [--sizes 1000,10000] [--repeats 15] [--teams 50]
        [--workers 64]

For each size: a fresh Postgres database migrated to head, ``--teams`` teams (weights 0.5-4, a
third with a quota), that many queued jobs spread over them (priorities mixed, mostly 1 GPU), and
``--workers`` fake 1-GPU workers advertised in a private ``redis-server`` (the scheduler sends
its Celery messages there too). The first tick dispatches one job per worker and writes a
pending reason for every other job; the following ticks find nothing to change (the steady state
of a busy queue: every read, the plan, no writes). It prints both against the 200 ms target.
``benchmarks/scheduler_decision.py`` times the pure decision alone.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table, median  # noqa: E402
from _service_stack import migrated_database  # noqa: E402

from api.cli.dev import start_redis, stop_process  # noqa: E402
from api.scheduling.scheduler import Scheduler  # noqa: E402
from api.settings import Settings  # noqa: E402
from api.store import bus  # noqa: E402
from api.store.db import session_scope  # noqa: E402
from api.store.pools import ensure_pool  # noqa: E402
from api.store.tables import Job, Team, TeamQuota, utcnow  # noqa: E402
from api.vocabulary import Heartbeat  # noqa: E402

TARGET_MS = 200.0


def seed(url: str, jobs: int, teams: int, rng: random.Random) -> None:
    now = utcnow()
    with session_scope(url) as session:
        session.execute(Team.__table__.insert(), [
            {"name": f"team-{t:02d}", "weight": rng.choice((0.5, 1.0, 2.0, 4.0)), "created_at": now}
            for t in range(teams)])
        ids = [row[0] for row in session.execute(Team.__table__.select().with_only_columns(Team.id))]
        ensure_pool(session, "default")
        session.execute(TeamQuota.__table__.insert(), [
            {"team_id": t, "pool": "default", "gpus": rng.choice((2, 4, 8))} for t in ids[: teams // 3]])
        session.execute(Job.__table__.insert(), [
            {"team_id": rng.choice(ids), "name": f"j{i}", "spec": {}, "status": "queued",
             "priority": rng.choice(("low", "normal", "normal", "high")), "pool": "default",
             "gpus": rng.choice((1, 1, 1, 2)), "max_steps": 10, "attempt": 0, "cancel_requested": False,
             "preempt_requested": False, "created_at": now, "last_step": 0}
            for i in range(jobs)])


def measure(size: int, args: argparse.Namespace, redis_url: str) -> list[object]:
    rng = random.Random(args.seed)
    with migrated_database("postgres") as url:
        seed(url, size, args.teams, rng)
        settings = Settings(database_url=url, redis_url=redis_url)
        scheduler = Scheduler(settings)
        scheduler.client.flushdb()
        for w in range(args.workers):
            bus.advertise_worker(scheduler.client, scheduler.keys, Heartbeat(worker_id=f"bench-{w}"), 600)
        started = time.perf_counter()
        sent = scheduler.tick()
        first_ms = (time.perf_counter() - started) * 1000
        steady = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            assert scheduler.tick() == []  # every worker is promised: nothing to do but look
            steady.append((time.perf_counter() - started) * 1000)
        steady.sort()
        p95 = steady[min(len(steady) - 1, round(0.95 * (len(steady) - 1)))]
        scheduler.client.close()
    return [size, len(sent), round(first_ms, 1), round(median(steady), 1), round(p95, 1),
            round(TARGET_MS / median(steady), 2)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    redis_url, redis_process = start_redis()
    try:
        rows = [measure(int(size), args, redis_url) for size in args.sizes.split(",")]
    finally:
        stop_process(redis_process)
    print(format_table(["queued jobs", "dispatched", "first tick ms", "steady tick ms (median)", "p95 ms",
                        "target/steady"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
