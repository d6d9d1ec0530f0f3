"""Metric publish -> WebSocket receive latency of ``WS /v1/jobs/{id}/stream`` (deliverable 9a).

What is measured
    For K = 1, 10, 100 concurrent subscribers on one running job: the time from the moment a
    worker has a step's metric record to the moment each subscriber's application code holds
    that step's WebSocket message. Reported per K: p50/p90/p99/max over every (subscriber, step)
    pair, the same measured from the XADD instead (so the SQL commit is split off), messages
    lost and duplicated (both must be 0: the stream promises each step exactly once), how many
    subscribers got the final ``status`` and a clean 1000 close, the server's CPU use, and the
    load average. Target: p99 < 50 ms at K = 100 (end to end, from before the SQL write).

How
    * Server: the real app, ``uvicorn --factory api.main:create_app`` (one worker, uvloop and
      httptools as uvicorn picks them), in its own process on a free port, configured by
      ``GRPO_*`` variables, on a fresh Postgres database migrated to head (``--backend sqlite``
      for a SQLite file) and Redis database 14.
    * Job: created through the store (``jobs.create_job``), then ``dispatch_job`` and ``claim``:
      a ``running`` job, as a worker would leave it. A new job for each K.
    * Subscribers: a separate process (this script, ``--role subscribers``; asyncio with uvloop
      when installed, ``websockets`` client), K connections with ``?after=0``; each waits for the
      initial ``status`` before the process prints READY, so connection and backlog time are not
      in the figures. Receive time is ``time.time()`` right after ``recv()`` returns.
    * Publisher: this process, with the worker's own code: ``worker.reporting.JobReporter.on_step``
      (``record_metrics`` + ``set_progress`` in one committed transaction, then the staged
      message's XADD) at a fixed schedule (``--rate`` steps/s, default 20, for ``--steps`` steps,
      default 200). Each record carries ``bench_t0 = time.time()`` taken just before ``on_step``;
      the publish callable notes the time just before the XADD. After the last step the job is
      finished (``attempts.finish``, which publishes its status), as the worker does; subscribers
      then expect the final ``status`` and a 1000 close.
    * Where the time goes: the server's CPU (its process group, /proc), a thread here timing
      ``GET /healthz`` every 10 ms (an ``async`` route, so its round trip shows server event-loop
      stalls), the subscriber process's own loop stalls, and the publisher's lateness; ``--json``
      also keeps per-step first/last-subscriber latencies and those series.
    All processes share one clock (``time.time()`` on one machine).

Usage
    .venv/bin/python benchmarks/service_stream_latency.py [--backend postgres|sqlite]
        [--subscribers 1,10,100] [--steps 200] [--rate 20] [--json out.json] [--py-spy prof.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table  # noqa: E402
from _service_stack import (  # noqa: E402
    APP,
    REDIS_URL,
    TOKEN,
    LoopProbe,
    Role,
    cpu_seconds,
    drop_streams,
    fmt_ms,
    loadavg,
    migrated_database,
    percentiles,
    tiny_spec,
    uvicorn_server,
    write_json,
)

TARGET_P99_S = 0.050
TARGET_K = 100
STREAM_MAXLEN = 100_000
SPEC = tiny_spec("stream-bench", max_steps=100_000)


# ---- subscriber side (its own process) ----


async def _subscribe(url: str, k: int, timeout_s: float) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    headers = {"Authorization": f"Bearer {TOKEN}"}
    logs = [{"steps": [], "recv": [], "statuses": [], "close_code": None} for _ in range(k)]
    connected, all_ready = 0, asyncio.Event()

    async def follow(log: dict[str, Any]) -> None:
        nonlocal connected
        async with connect(
            url, additional_headers=headers, proxy=None, open_timeout=30, max_queue=None
        ) as ws:
            with contextlib.suppress(ConnectionClosed):  # an abnormal close: close_code tells
                async for raw in ws:
                    received = time.time()
                    message = json.loads(raw)
                    if message["type"] == "metrics":
                        log["steps"].append(message["step"])
                        log["recv"].append(received)
                    elif message["type"] == "status":
                        log["statuses"].append(message["status"])
                        if len(log["statuses"]) == 1:
                            connected += 1
                            if connected == k:
                                all_ready.set()
            log["close_code"] = ws.close_code

    async def lag_monitor() -> None:  # this process's own stalls, which would look like server delay
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            if (late := time.perf_counter() - start - 0.005) > 0.005:
                lags.append((time.time(), late))

    lags: list[tuple[float, float]] = []
    tasks = [asyncio.create_task(follow(log)) for log in logs]
    await asyncio.wait_for(all_ready.wait(), 60)
    monitor = asyncio.create_task(lag_monitor())
    print("READY", flush=True)
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in [*pending, monitor]:
        task.cancel()
    for task in done:
        if task.exception() is not None:
            raise task.exception()
    return {"logs": logs, "client_lag": lags}


def run_subscribers(args: argparse.Namespace) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    write_json(args.result_file, asyncio.run(_subscribe(args.url, args.k, args.timeout)))


# ---- server side: job, publisher ----


def running_job(database_url: str) -> int:
    from api.domain.job_spec import JobSpec
    from api.store import attempts, jobs, teams
    from api.store.db import session_scope
    from api.store.dispatching import dispatch_job

    with session_scope(database_url) as session:
        team_id = teams.team_id_by_name(session, teams.DEFAULT_TEAM)
        job, _ = jobs.create_job(session, team_id, JobSpec.model_validate(SPEC))
    with session_scope(database_url) as session:
        assert dispatch_job(session, job.id, "bench-worker")
        assert attempts.claim(session, job.id, "bench-worker") is not None
    return job.id


def publish_steps(database_url: str, job_id: int, steps: int, rate: float) -> dict[str, Any]:
    """The worker's step path at a fixed schedule; per step: t0 and the time just before XADD."""
    import redis

    from api.domain.lifecycle import JobStatus
    from api.redis_keys import RedisKeys, namespace_for
    from api.store import attempts, bus
    from api.store.db import session_scope
    from worker.reporting import JobReporter

    xadd_at: dict[int, float] = {}
    client = redis.Redis.from_url(REDIS_URL)
    publish = bus.publisher(client, RedisKeys(namespace_for(database_url)), STREAM_MAXLEN)

    def timed_publish(messages: list) -> None:
        for message in messages:
            if message.kind == "metrics":
                xadd_at[int(message.data["step"])] = time.time()
        publish(messages)

    reporter = JobReporter(database_url, job_id, timed_publish, lease=None)
    t0: dict[int, float] = {}
    late, start = [], time.monotonic() + 0.05
    for step in range(1, steps + 1):
        due = start + (step - 1) / rate
        time.sleep(max(0.0, due - time.monotonic()))
        late.append(time.monotonic() - due)
        record = {
            "step": step,
            "reward": 0.01 * step,
            "reward_std": 0.5,
            "kl": 0.001 * step,
            "loss": 0.0,
            "clip_ratio/region_mean": 0.02,
            "rewards/exact_match/mean": 0.01 * step,
            "bench_t0": time.time(),
        }
        t0[step] = record["bench_t0"]
        reporter.on_step(record)
    with session_scope(database_url, publish=publish) as session:
        assert attempts.finish(session, job_id, worker_id="bench-worker", outcome=JobStatus.SUCCEEDED,
                           message="benchmark done")
    client.close()
    return {"t0": t0, "xadd": xadd_at, "schedule_late": late}


def measure(database_url: str, http_base: str, pgid: int, k: int, args: argparse.Namespace) -> dict[str, Any]:
    job_id = running_job(database_url)
    url = f"{http_base.replace('http://', 'ws://')}/v1/jobs/{job_id}/stream?after=0"
    budget = args.steps / args.rate + 30
    with Role(
        Path(__file__), ["--role", "subscribers", "--url", url, "--k", str(k), "--timeout", str(budget)]
    ) as role:
        role.wait_for("READY", 90)
        load_before, cpu0, wall0 = loadavg(), cpu_seconds(pgid), time.monotonic()
        with LoopProbe(http_base) as probe:
            published = publish_steps(database_url, job_id, args.steps, args.rate)
        client = role.result(budget + 30)
        server_cpu = (cpu_seconds(pgid) - cpu0) / (time.monotonic() - wall0)
    t0, xadd, logs = published["t0"], published["xadd"], client["logs"]
    latency, from_xadd, lost, dup, disorder, clean = [], [], 0, 0, 0, 0
    by_step: dict[int, list[float]] = {}
    for log in logs:
        seen, previous = set(), 0
        for step, received in zip(log["steps"], log["recv"], strict=True):
            if step in seen:
                dup += 1
                continue
            disorder, previous = disorder + (step < previous), step
            seen.add(step)
            latency.append(received - t0[step])
            from_xadd.append(received - xadd[step])
            by_step.setdefault(step, []).append(received - t0[step])
        lost += len(set(t0) - seen)
        clean += log["close_code"] == 1000 and log["statuses"][-1:] == ["succeeded"]
    sql = [xadd[s] - t0[s] for s in t0]
    first = min(t0.values())

    def series(points: list[tuple[float, float]]) -> list[list[float]]:
        return [[round(t - first, 4), fmt_ms(value)] for t, value in points]

    raw = {  # time axis: seconds since the first step's t0; values in ms
        "per_step": [
            [
                step,
                round(t0[step] - first, 4),
                fmt_ms(xadd[step] - t0[step]),
                fmt_ms(min(by_step.get(step, [0]))),
                fmt_ms(max(by_step.get(step, [0]))),
            ]
            for step in t0
        ],  # [step, t, SQL, first subscriber's latency, last one's]
        "probe": series(probe.samples),
        "client_lag": series(client["client_lag"]),
    }
    return {
        "k": k,
        "job_id": job_id,
        "messages": len(latency),
        "latency": percentiles(latency),
        "from_xadd": percentiles(from_xadd),
        "sql_commit": percentiles(sql),
        "lost": lost,
        "duplicated": dup,
        "out_of_order": disorder,
        "clean_close": clean,
        "schedule_late_max_s": max(published["schedule_late"]),
        "server_cpu": server_cpu,
        "probe": percentiles([rtt for _, rtt in probe.samples]),
        "client_lag_max_s": max([lag for _, lag in client["client_lag"]], default=0.0),
        "load_before": load_before,
        "load_after": loadavg(),
        "raw": raw,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--subscribers", default="1,10,100", help="comma-separated K values")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="published steps per second")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--app", default=APP, help="uvicorn factory (experiments only; default the real app)")
    parser.add_argument("--uvicorn-arg", action="append", default=[], help="extra uvicorn option, repeatable")
    parser.add_argument("--py-spy", help="profile the server with py-spy (raw collapsed stacks here)")
    parser.add_argument("--role", choices=("main", "subscribers"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "subscribers":
        run_subscribers(args)
        return
    ks = [int(k) for k in args.subscribers.split(",")]
    started = datetime.datetime.now().astimezone()
    print(
        f"{started:%Y-%m-%d %H:%M:%S %Z}  backend={args.backend}  steps={args.steps} at {args.rate:g}/s  "
        f"load(1/5/15m)={loadavg()}",
        flush=True,
    )
    results, ids = [], range(1, len(ks) + 1)  # a fresh database numbers its jobs from 1
    url = None
    try:
        with (
            migrated_database(args.backend) as url,
            uvicorn_server(
                url,
                stream_maxlen=STREAM_MAXLEN,
                profile_to=Path(args.py_spy) if args.py_spy else None,
                app=args.app,
                extra_args=args.uvicorn_arg,
            ) as (base, pgid),
        ):
            for k in ks:
                results.append(measure(url, base, pgid, k, args))
                print(f"  K={k} done, load {results[-1]['load_after']}", flush=True)
    finally:
        if url is not None:
            drop_streams(url, ids)
    report(results)
    if args.json:
        write_json(args.json, {"started": started.isoformat(), "args": vars(args), "results": results})


def report(results: list[dict[str, Any]]) -> None:
    main_rows, where_rows = [], []
    for r in results:
        lat, frx, sql, probe = r["latency"], r["from_xadd"], r["sql_commit"], r["probe"]
        main_rows.append(
            [
                r["k"],
                r["messages"],
                fmt_ms(lat["p50"]),
                fmt_ms(lat["p90"]),
                fmt_ms(lat["p99"]),
                fmt_ms(lat["max"]),
                r["lost"],
                r["duplicated"],
                r["out_of_order"],
                f"{r['clean_close']}/{r['k']}",
                r["load_before"],
                r["load_after"],
            ]
        )
        where_rows.append(
            [
                r["k"],
                *map(fmt_ms, (sql["p50"], sql["p99"], frx["p50"], frx["p99"])),
                round(100 * r["server_cpu"]),
                *map(
                    fmt_ms,
                    (
                        probe["p50"],
                        probe["p99"],
                        probe["max"],
                        r["client_lag_max_s"],
                        r["schedule_late_max_s"],
                    ),
                ),
            ]
        )
    print("\nLatency, publish (bench_t0, before the SQL write) -> subscriber recv(), ms")
    print(
        format_table(
            [
                "K",
                "msgs",
                "p50",
                "p90",
                "p99",
                "max",
                "lost",
                "dup",
                "disorder",
                "clean end",
                "load before",
                "load after",
            ],
            main_rows,
        )
    )
    print(
        "\nWhere it goes, ms: SQL = worker's commit (t0 -> XADD); XADD = XADD -> recv(); srv CPU = server\n"
        "process CPU / wall; probe = GET /healthz round trip every 10 ms during publishing (server event\n"
        "loop stalls); client lag = subscriber process's own worst loop stall; late = publisher schedule"
    )
    print(
        format_table(
            [
                "K",
                "SQL p50",
                "SQL p99",
                "XADD p50",
                "XADD p99",
                "srv CPU %",
                "probe p50",
                "probe p99",
                "probe max",
                "client lag",
                "late",
            ],
            where_rows,
        )
    )
    at_target = [r for r in results if r["k"] == TARGET_K]
    for r in at_target:
        ok = r["latency"]["p99"] < TARGET_P99_S and r["lost"] == 0 and r["duplicated"] == 0
        print(
            f"\nTarget p99 < {TARGET_P99_S * 1000:g} ms at K={TARGET_K} with 0 lost/dup: "
            f"{'PASS' if ok else 'FAIL'} (p99 {fmt_ms(r['latency']['p99'])} ms, "
            f"lost {r['lost']}, dup {r['duplicated']})"
        )
    if not at_target:
        print(f"\nTarget not judged: K={TARGET_K} was not run")


if __name__ == "__main__":
    main()
