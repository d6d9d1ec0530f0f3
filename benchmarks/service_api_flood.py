"""One team floods the API at its limits; another team's ``GET /v1/jobs`` latency and the API's memory.

What is measured
    On the real stack (uvicorn, one worker as deployed, on a fresh Postgres database and Redis;
    ``benchmarks/_service_stack.py``), two member keys of two teams:

    * quiet: the other team's ``GET /v1/jobs?limit=50`` (20 small jobs of its own), sent every
      ``1/--quiet-rate`` s (40/s) from one connection for ``--duration`` s; latency per request.
    * flood: the flooding team, from ``--flooders`` connections each (4), as fast as the server
      answers: ``POST /v1/jobs`` of a ~0.9 MiB valid spec (inline rows), ``GET
      /v1/jobs?include=spec&limit=100`` over its own big jobs (10 made before it starts), and
      ``POST /v1/jobs`` of a ~0.5 MiB YAML spec that validation refuses (its last row has no
      prompt), YAML being the costliest body to parse. What its limits do not admit is a 429,
      which each connection obeys (it waits ``Retry-After``, as a client at its limit does); what
      they admit is the load the other team must not feel.

    The quiet client alone (baseline), then the same quiet client while the flood runs, repeated
    ``--rounds`` times (2) against one server, each condition's latencies pooled: alternating
    keeps a drift in a shared machine's load out of the ratio. Printed: quiet p50/p99/max in both
    conditions and their p99 ratio (target: flooded p99 <= 2x quiet p99), the flood's answers by
    status, and the API process's RSS (every 0.1 s: before, peak during the floods, after;
    bound: ``--rss-bound-mib``, 400 MiB by default).

How
    Clients are separate processes (this script, ``--role quiet|flood``), never the server's; the
    flood writes pre-built requests on raw keep-alive sockets (the load generator's own CPU would
    otherwise compete with the server on a small machine). The flooding team's limits are the
    deployment's defaults (``GRPO_TEAM_*``) unless ``--flood-limits`` gives JSON for
    ``PUT /v1/admin/teams/{team}/limits``.

Usage
    .venv/bin/python benchmarks/service_api_flood.py [--duration 20] [--rounds 2] [--flooders 4]
        [--quiet-rate 40] [--flood-limits '{"writes_per_second": 5}'] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table  # noqa: E402
from _service_stack import (  # noqa: E402
    APP,
    TOKEN,
    Role,
    RssSampler,
    fmt_ms,
    loadavg,
    migrated_database,
    percentiles,
    tiny_spec,
    uvicorn_server,
    write_json,
)
from service_api_throughput import roots  # noqa: E402 - the same models root (a tiny model as `tiny`)

WARMUP_S = 2.0
FLOOD_CAP_S = 600.0  # a flooder whose orchestrator died stops anyway
QUIET_GRACE_S = 60.0
QUIET_JOBS = 20
FLOOD_JOBS = 10
# ~200 bytes a row: 4,200 rows make a ~0.9 MiB spec, under the 1 MiB request limit.
BIG_ROWS, REFUSED_ROWS = 4200, 2400


def rows(count: int) -> list[dict[str, str]]:
    return [{"prompt": f"row {n} " + "z" * 170, "answer": str(n)} for n in range(count)]


def flood_bodies() -> dict[str, bytes]:
    big = json.dumps(tiny_spec("flood", dataset={"prompts": rows(BIG_ROWS)})).encode()
    no_prompt = [*rows(REFUSED_ROWS), {"answer": "x"}]  # refused only once every row was read
    refused = yaml.safe_dump(tiny_spec("refused", dataset={"prompts": no_prompt})).encode()
    return {"submit": big, "refused": refused, "list": b""}


# ---- client side (their own processes) ----


def run_quiet(args: argparse.Namespace) -> None:
    """GET /v1/jobs on a fixed schedule after a 2 s warm-up, from one connection. Each scheduled
    request's latency runs from its due time to the end of the first request sent at or after it,
    so a stall counts for every request it held back, not once (no coordinated omission); slots
    still waiting :data:`QUIET_GRACE_S` after the phase count as late as that (``unserved``)."""
    import httpx

    latencies, statuses = [], {}
    with httpx.Client(base_url=args.base, headers={"Authorization": f"Bearer {args.key}"},
                      timeout=QUIET_GRACE_S, trust_env=False) as client:
        warm_until = time.monotonic() + WARMUP_S
        while time.monotonic() < warm_until:
            client.get("/v1/jobs", params={"limit": 50})
            time.sleep(1 / args.quiet_rate)
        start = time.monotonic()
        due = [start + i / args.quiet_rate for i in range(int(args.duration * args.quiet_rate))]
        give_up = start + args.duration + QUIET_GRACE_S
        while len(latencies) < len(due) and time.monotonic() < give_up:
            time.sleep(max(0.0, due[len(latencies)] - time.monotonic()))
            sent = time.monotonic()
            try:
                status = str(client.get("/v1/jobs", params={"limit": 50}).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            done = time.monotonic()
            served = [when for when in due[len(latencies):] if when <= sent]
            latencies += [done - when for when in served]
            statuses[status] = statuses.get(status, 0) + len(served)
        unserved = len(due) - len(latencies)
        latencies += [give_up - when for when in due[len(latencies):]]
    write_json(args.result_file, {"latencies": latencies, "statuses": statuses, "unserved": unserved})


def _request(host: str, key: str, kind: str, body: bytes) -> bytes:
    method, target = ("GET", "/v1/jobs?include=spec&limit=100") if kind == "list" else ("POST", "/v1/jobs")
    media = "application/yaml" if kind == "refused" else "application/json"
    head = (f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: {media}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(name + b":"):
            return line.split(b":", 1)[1].strip()
    return None


async def _flooder(host: str, port: int, request: bytes, stop: Path, counts: dict[str, int]) -> None:
    """One keep-alive connection sending ``request`` back to back until ``stop`` exists, counting
    answers by status; a 429 is obeyed (it waits ``Retry-After``), as a client at its limit does.
    A connection the server closed (idle past its keep-alive while waiting) is opened again and
    counted as ``closed``."""
    until = time.monotonic() + FLOOD_CAP_S
    connection = None
    while time.monotonic() < until and not stop.exists():
        try:
            connection = connection or await asyncio.open_connection(host, port)
            reader, writer = connection
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(_header(head, b"content-length") or 0))
        except (asyncio.IncompleteReadError, ConnectionError):
            counts["closed"] = counts.get("closed", 0) + 1
            connection = None
            continue
        status = head.split(b" ", 2)[1].decode()
        counts[status] = counts.get(status, 0) + 1
        if status == "429":
            await asyncio.sleep(min(float(_header(head, b"retry-after") or 1), until - time.monotonic()))
    if connection is not None:
        connection[1].close()


async def _flood(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    host, port = args.base.removeprefix("http://").split(":")
    counts: dict[str, dict[str, int]] = {}
    tasks = []
    for kind, body in flood_bodies().items():
        request = _request(host, args.key, kind, body)
        counts[kind] = {}
        tasks += [_flooder(host, int(port), request, Path(args.stop_file), counts[kind])
                  for _ in range(args.flooders)]
    print("flooding", flush=True)
    await asyncio.gather(*tasks)
    return counts


def run_flood(args: argparse.Namespace) -> None:
    write_json(args.result_file, asyncio.run(_flood(args)))


# ---- orchestration ----


def make_teams(database_url: str) -> tuple[str, str]:
    """Member keys of two new teams, made through the store as ``grpo admin`` does, and
    :data:`FLOOD_JOBS` big jobs of the flooding team (through the store too, past its limits), so
    its spec-carrying lists carry a full page of specs from the first request."""
    from api.domain.job_spec import JobSpec
    from api.store import teams
    from api.store.db import session_scope
    from api.store.jobs import create_job

    big = JobSpec.model_validate(tiny_spec("flood-seed", dataset={"prompts": rows(BIG_ROWS)}))
    with session_scope(database_url) as session:
        quiet, flood = (teams.create_team(session, name) for name in ("quiet", "flood"))
        for _ in range(FLOOD_JOBS):
            create_job(session, flood.id, big)
        return teams.create_key(session, "quiet")[1], teams.create_key(session, "flood")[1]


def prepare(base: str, quiet_key: str, flood_limits: str | None) -> None:
    import httpx

    with httpx.Client(base_url=base, timeout=60, trust_env=False) as client:
        for n in range(QUIET_JOBS):
            response = client.post("/v1/jobs", json=tiny_spec(f"quiet-{n}"),
                                   headers={"Authorization": f"Bearer {quiet_key}"})
            response.raise_for_status()
        if flood_limits:
            client.put("/v1/admin/teams/flood/limits", json=json.loads(flood_limits),
                       headers={"Authorization": f"Bearer {TOKEN}"}).raise_for_status()


def client_args(args: argparse.Namespace, role: str, base: str, key: str, stop: Path) -> list[str]:
    return ["--role", role, "--base", base, "--key", key, "--duration", str(args.duration),
            "--quiet-rate", str(args.quiet_rate), "--flooders", str(args.flooders), "--stop-file", str(stop)]


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for run in runs:
        for status, count in run["statuses"].items():
            statuses[status] = statuses.get(status, 0) + count
    return {"latencies": [value for run in runs for value in run["latencies"]], "statuses": statuses,
            "unserved": sum(run["unserved"] for run in runs)}


def measure(args: argparse.Namespace, base: str, pid: int, keys: tuple[str, str]) -> dict[str, Any]:
    """``--rounds`` rounds of (quiet alone, quiet during the flood), each condition's latencies
    pooled: alternating keeps a drift in the shared machine's load out of the ratio."""
    quiet_key, flood_key = keys
    script = Path(__file__)
    timeout = args.duration + WARMUP_S + QUIET_GRACE_S + 120
    alone, flooded, floods, before, peaks = [], [], [], [], []
    with RssSampler(pid) as rss, tempfile.TemporaryDirectory(prefix="grpo-bench-flood-") as folder:
        for round_ in range(args.rounds):
            stop = Path(folder) / f"stop-{round_}"  # the flood runs until its quiet phase has ended
            start = time.monotonic()
            with Role(script, client_args(args, "quiet", base, quiet_key, stop)) as quiet:
                alone.append(quiet.result(timeout))
            flood_start = time.monotonic()
            with Role(script, client_args(args, "flood", base, flood_key, stop)) as flood:
                flood.wait_for("flooding", 30)
                with Role(script, client_args(args, "quiet", base, quiet_key, stop)) as quiet:
                    flooded.append(quiet.result(timeout))
                stop.touch()
                floods.append(flood.result(timeout))
            before.append(max(rss.between(start, flood_start)))
            peaks.append(max(rss.between(flood_start, time.monotonic())))
        time.sleep(2)
    counts: dict[str, dict[str, int]] = {}
    for flood_counts in floods:
        for kind, by_status in flood_counts.items():
            for status, count in by_status.items():
                counts.setdefault(kind, {})[status] = counts.setdefault(kind, {}).get(status, 0) + count
    return {"quiet": _pooled(alone), "flooded": _pooled(flooded), "flood": counts,
            "rss_before": before[0], "rss_peak": max(peaks), "rss_after": rss.samples[-1][1]}


def report(result: dict[str, Any], args: argparse.Namespace) -> bool:
    quiet, flooded = percentiles(result["quiet"]["latencies"]), percentiles(result["flooded"]["latencies"])
    print(f"\nGET /v1/jobs?limit=50 of the quiet team, {args.quiet_rate:g}/s, {args.rounds} x "
          f"{args.duration:g} s per condition, pooled; ms")
    rows_ = [[name, len(r["latencies"]), json.dumps(r["statuses"]), r["unserved"],
              *(fmt_ms(p[k]) for k in ("p50", "p90", "p99", "max"))]
             for name, r, p in (("quiet", result["quiet"], quiet), ("flooded", result["flooded"], flooded))]
    print(format_table(["phase", "scheduled", "answers", "unserved", "p50", "p90", "p99", "max"], rows_))
    print("\nflood answers by status (all flooders together):")
    for kind, counts in result["flood"].items():
        print(f"  {kind:8} {json.dumps(dict(sorted(counts.items())))}")
    ratio = flooded["p99"] / quiet["p99"]
    print(f"\nAPI RSS (MiB): before {result['rss_before']:.0f}, peak during the flood "
          f"{result['rss_peak']:.0f}, after {result['rss_after']:.0f}")
    flooded_answers = result["flooded"]
    latency_ok = (ratio <= 2.0 and set(flooded_answers["statuses"]) == {"200"}
                  and not flooded_answers["unserved"])
    memory_ok = result["rss_peak"] <= args.rss_bound_mib
    print(f"quiet p99 flooded / quiet p99 alone = {fmt_ms(flooded['p99'])} / {fmt_ms(quiet['p99'])} ms = "
          f"{ratio:.2f} (target <= 2): {'PASS' if latency_ok else 'FAIL'}")
    print(f"peak RSS {result['rss_peak']:.0f} MiB (bound {args.rss_bound_mib:g}): "
          f"{'PASS' if memory_ok else 'FAIL'}")
    return latency_ok and memory_ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measured phase")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (quiet alone, quiet flooded)")
    parser.add_argument("--quiet-rate", type=float, default=40.0, help="the quiet team's requests per second")
    parser.add_argument("--flooders", type=int, default=4, help="connections per kind of flood request")
    parser.add_argument("--flood-limits", help="JSON limits of the flooding team (default: the defaults)")
    parser.add_argument("--rss-bound-mib", type=float, default=400.0)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--app", default=APP, help="uvicorn factory (experiments only; default the real app)")
    parser.add_argument("--role", choices=("main", "quiet", "flood"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role != "main":
        (run_quiet if args.role == "quiet" else run_flood)(args)
        return
    started = datetime.datetime.now().astimezone()
    print(f"{started:%Y-%m-%d %H:%M:%S %Z}  duration={args.duration:g} s/phase  "
          f"flooders={args.flooders}/kind  load(1/5/15m)={loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="grpo-bench-roots-") as folder, \
            migrated_database("postgres") as url, \
            uvicorn_server(url, app=args.app, **roots(Path(folder))) as (base, pid):
        keys = make_teams(url)
        prepare(base, keys[0], args.flood_limits)
        result = measure(args, base, pid, keys)
    passed = report(result, args)
    print(f"load(1/5/15m) at the end: {loadavg()}")
    if args.json:
        write_json(args.json, {"started": started.isoformat(), "args": vars(args), "result": result})
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
