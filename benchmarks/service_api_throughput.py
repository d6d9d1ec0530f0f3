"""``POST /v1/jobs`` and ``GET /v1/jobs`` throughput and latency on Postgres (deliverable 9b).

What is measured
    With 50 concurrent HTTP clients against the real server, for one uvicorn worker and for
    ``--workers 2`` (this machine has 2 cores):

    (i)   closed-loop submit: 50 clients each send ``POST /v1/jobs`` (a valid spec: ``model.source:
          path:tiny``, inline prompts, ``exact_match``), the next as soon as the last answers, for
          ``--duration`` s (default 20) -> completed requests/s, p50/p99/max latency;
    (ii)  open-loop submit: requests *scheduled* at exact 1/``--rate`` intervals (default 200/s)
          for ``--duration`` s, sent over at most 50 connections; latency runs from the scheduled
          time, so time spent queued behind a slow server counts (no coordinated omission)
          -> achieved rate, p50/p99/max. Target: p99 < 50 ms;
    (iii) closed-loop list: 50 clients doing ``GET /v1/jobs?limit=100`` (a full page: the table
          holds the thousands of jobs (i) and (ii) made) -> requests/s, p50/p99/max.
    For each phase also: non-2xx answers and transport errors, the server's CPU (all its
    processes) and the client's, as a share of one core, and the 1/5/15-minute load average.

How
    * Server: ``python -m uvicorn --factory api.main:create_app --workers N`` (``create_app()`` with
      no argument reads ``GRPO_*`` variables: database URL, Redis, token, models and data roots) on a
      fresh Postgres database migrated to head (a new one per configuration), with a models root
      holding a ``grpo_core.io.tiny_models.build_tiny_model`` folder named ``tiny``, so submission
      checks pass.
    * Clients: a separate process (this script, ``--role client``), asyncio (uvloop when installed)
      with one ``httpx.AsyncClient`` capped at 50 connections, bearer token, body pre-serialised.
      Each phase starts after a 2 s closed-loop warm-up of the same request that is not counted.
      ``--http raw`` swaps httpx for :class:`RawClient` (same requests, ~1/40 of the client CPU), to
      tell the server's limits from the load generator's on a machine the two share.
    * The server logs at ``info`` with uvicorn's access log on (to a file), as ``grpo api`` does.
    * The target is judged on one worker: that is what the project deploys (``grpo api`` and
      docker-compose call ``uvicorn.run`` without ``workers``), and on this 2-core machine a second
      worker competes with Postgres, Redis and the load generator rather than adding a free core;
      ``--workers 2`` is reported to show how far the same box gets by adding a process.

Usage
    .venv/bin/python benchmarks/service_api_throughput.py [--workers 1,2] [--duration 20]
        [--rate 200] [--clients 50] [--json out.json] [--py-spy prof.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table  # noqa: E402
from _service_stack import (  # noqa: E402
    APP,
    TOKEN,
    Role,
    cpu_seconds,
    fmt_ms,
    loadavg,
    migrated_database,
    percentiles,
    tiny_spec,
    uvicorn_server,
    write_json,
)

TARGET_P99_S = 0.050
WARMUP_S = 2.0
SPEC = tiny_spec("throughput-bench", max_steps=20)
BODY = json.dumps(SPEC).encode()
PHASES = {
    "post": ("POST closed", "POST", "/v1/jobs"),
    "open": ("POST open", "POST", "/v1/jobs"),
    "get": ("GET closed", "GET", "/v1/jobs?limit=100"),
}


# ---- client side (its own process) ----


class Phase:
    """Latencies and outcomes of one phase, with the CPU and load around it."""

    def __init__(self, name: str, pgid: int) -> None:
        self.name, self.pgid, self.latencies, self.errors = name, pgid, [], {}
        self.load_before, self.server_cpu0 = loadavg(), cpu_seconds(pgid)
        self.own_cpu0, self.start = sum(os.times()[:2]), time.perf_counter()

    def outcome(self, status: int | str, latency: float) -> None:
        if isinstance(status, int) and 200 <= status < 300:
            self.latencies.append(latency)
        else:
            self.errors[str(status)] = self.errors.get(str(status), 0) + 1

    def summary(self, wall: float | None = None) -> dict[str, Any]:
        wall = wall or time.perf_counter() - self.start
        return {
            "phase": self.name,
            "ok": len(self.latencies),
            "errors": self.errors,
            "wall_s": wall,
            "rate": len(self.latencies) / wall,
            **percentiles(self.latencies),
            "server_cpu": (cpu_seconds(self.pgid) - self.server_cpu0) / wall,
            "client_cpu": (sum(os.times()[:2]) - self.own_cpu0) / wall,
            "load_before": self.load_before,
            "load_after": loadavg(),
        }


class RawClient:
    """``--http raw``: HTTP/1.1 keep-alive over asyncio streams, requests pre-built as bytes, at
    most ``size`` connections. Same wire traffic as httpx at a fraction of its CPU, to show how
    much of a result is the Python load generator's own cost on a machine it shares."""

    def __init__(self, base: str, size: int) -> None:
        self.host, self.port = base.removeprefix("http://").split(":")
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(size)

    def _bytes(self, method: str, url: str) -> bytes:
        body = BODY if method == "POST" else b""
        head = (
            f"{method} {url} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def request(self, method: str, url: str) -> int:
        async with self.slots:
            while self.idle:  # uvicorn closes a connection idle for 5 s; skip those, as httpx does
                reader, writer = self.idle.pop()
                if not reader.at_eof():
                    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                        return await self._exchange(reader, writer, method, url)
                writer.close()
            reader, writer = await asyncio.open_connection(self.host, int(self.port))
            return await self._exchange(reader, writer, method, url)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, url: str
    ) -> int:
        writer.write(self._bytes(method, url))
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        self.idle.append((reader, writer))
        return int(head.split(b" ", 2)[1])

    async def aclose(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def _request(client, method: str, url: str) -> tuple[int | str, float]:
    start = time.perf_counter()
    try:
        if isinstance(client, RawClient):
            return await client.request(method, url), time.perf_counter() - start
        if method == "POST":
            response = await client.post(url, content=BODY, headers={"Content-Type": "application/json"})
        else:
            response = await client.get(url)
        return response.status_code, time.perf_counter() - start
    except Exception as exc:  # a transport error is an outcome to count, not a crash
        return type(exc).__name__, time.perf_counter() - start


async def closed_loop(
    client, phase: Phase | None, method: str, url: str, clients: int, seconds: float
) -> None:
    end = time.perf_counter() + seconds

    async def one_client() -> None:
        while time.perf_counter() < end:
            status, latency = await _request(client, method, url)
            if phase is not None:
                phase.outcome(status, latency)

    await asyncio.gather(*(one_client() for _ in range(clients)))


async def open_loop(client, phase: Phase, url: str, rate: float, seconds: float) -> float:
    """Start request i at ``start + i / rate`` whatever came back; latency from that time."""
    loop = asyncio.get_running_loop()
    start, total, tasks = loop.time() + 0.05, int(rate * seconds), []

    async def one(due: float) -> None:
        status, _ = await _request(client, "POST", url)
        phase.outcome(status, loop.time() - due)

    for i in range(total):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    return loop.time() - start


async def _client_main(args: argparse.Namespace) -> list[dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    results = []
    client = (
        RawClient(args.base, args.clients)
        if args.http == "raw"
        else httpx.AsyncClient(
            base_url=args.base,
            headers={"Authorization": f"Bearer {TOKEN}"},
            limits=limits,
            timeout=httpx.Timeout(60.0),
            trust_env=False,
        )
    )
    try:
        for name, method, url in (PHASES[key] for key in args.phases.split(",")):
            await closed_loop(client, None, method, url, args.clients, WARMUP_S)
            phase = Phase(name, args.pgid)
            if name == "POST open":
                results.append(phase.summary(await open_loop(client, phase, url, args.rate, args.duration)))
            else:
                await closed_loop(client, phase, method, url, args.clients, args.duration)
                results.append(phase.summary())
            print(
                f"    {name}: {results[-1]['rate']:.0f} req/s, p99 {fmt_ms(results[-1]['p99'])} ms, "
                f"load {results[-1]['load_after']}",
                flush=True,
            )
    finally:
        await client.aclose()
    return results


def run_client(args: argparse.Namespace) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    write_json(args.result_file, asyncio.run(_client_main(args)))


# ---- orchestration ----


def roots(folder: Path) -> dict[str, Path]:
    from grpo_core.io.tiny_models import build_tiny_model

    build_tiny_model(folder / "models" / "tiny")
    (folder / "data").mkdir()
    return {"models_root": folder / "models", "data_root": folder / "data"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", default="1,2", help="uvicorn worker counts to try, comma-separated")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measured phase")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop arrivals per second")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--phases", default="post,open,get", help="of post (i), open (ii), get (iii)")
    parser.add_argument("--http", choices=("httpx", "raw"), default="httpx", help="client (see RawClient)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--app", default=APP, help="uvicorn factory (experiments only; default the real app)")
    parser.add_argument("--uvicorn-arg", action="append", default=[], help="extra uvicorn option, repeatable")
    parser.add_argument(
        "--py-spy",
        help="profile the server with py-spy (raw collapsed stacks, one file per worker count: NAME.wN)",
    )
    parser.add_argument("--role", choices=("main", "client"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--pgid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "client":
        run_client(args)
        return
    started = datetime.datetime.now().astimezone()
    print(
        f"{started:%Y-%m-%d %H:%M:%S %Z}  client={args.http}  clients={args.clients}  "
        f"duration={args.duration:g} s/phase  open-loop rate={args.rate:g}/s  load(1/5/15m)={loadavg()}",
        flush=True,
    )
    results: dict[int, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-roots-") as folder:
        settings = roots(Path(folder))
        for workers in (int(w) for w in args.workers.split(",")):
            print(f"  uvicorn --workers {workers}", flush=True)
            profile = Path(f"{args.py_spy}.w{workers}") if args.py_spy else None
            with (
                migrated_database("postgres") as url,
                uvicorn_server(
                    url,
                    workers=workers,
                    profile_to=profile,
                    access_log=True,
                    app=args.app,
                    extra_args=args.uvicorn_arg,
                    **settings,
                ) as (base, pgid),
            ):
                client_args = [
                    "--role",
                    "client",
                    "--base",
                    base,
                    "--pgid",
                    str(pgid),
                    "--clients",
                    str(args.clients),
                    "--duration",
                    str(args.duration),
                    "--rate",
                    str(args.rate),
                    "--phases",
                    args.phases,
                    "--http",
                    args.http,
                ]
                with Role(Path(__file__), client_args) as role:
                    results[workers] = role.result(3 * (args.duration + WARMUP_S) + 120)
    report(results, args)
    if args.json:
        write_json(args.json, {"started": started.isoformat(), "args": vars(args), "results": results})


def report(results: dict[int, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    rows = []
    for workers, phases in results.items():
        for p in phases:
            errors = sum(p["errors"].values())
            rows.append(
                [
                    workers,
                    p["phase"],
                    p["ok"],
                    errors,
                    round(p["rate"], 1),
                    fmt_ms(p["p50"]),
                    fmt_ms(p["p90"]),
                    fmt_ms(p["p99"]),
                    fmt_ms(p["max"]),
                    round(100 * p["server_cpu"]),
                    round(100 * p["client_cpu"]),
                    p["load_before"],
                    p["load_after"],
                ]
            )
    print(
        f"\n{args.clients} clients, {args.duration:g} s per phase; latency in ms (open loop: from the "
        "scheduled time); CPU in % of one core"
    )
    print(
        format_table(
            [
                "workers",
                "phase",
                "ok",
                "errors",
                "req/s",
                "p50",
                "p90",
                "p99",
                "max",
                "srv CPU",
                "client CPU",
                "load before",
                "load after",
            ],
            rows,
        )
    )
    for workers, phases in results.items():
        p = next((p for p in phases if p["phase"] == "POST open"), None)
        if p is None:
            continue
        ok = p["p99"] < TARGET_P99_S and not p["errors"] and p["rate"] >= 0.97 * args.rate
        judged = " (judged configuration)" if workers == 1 else " (for reference)"
        print(
            f"Target submit p99 < {TARGET_P99_S * 1000:g} ms at {args.rate:g} req/s, workers={workers}"
            f"{judged}: {'PASS' if ok else 'FAIL'} (p99 {fmt_ms(p['p99'])} ms at {p['rate']:.1f} req/s, "
            f"{sum(p['errors'].values())} errors)"
        )


if __name__ == "__main__":
    main()
