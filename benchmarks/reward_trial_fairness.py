"""One team floods ``POST /v1/rewards/run`` with slow dry runs; another team's trivial dry run latency.

What is measured
    On the real stack (uvicorn, one worker as deployed, a fresh Postgres database and Redis;
    ``benchmarks/_service_stack.py``; the API host's own bubblewrap sandbox scores the ``python``
    rewards, so ``bwrap`` must work here), two member keys of two teams:

    * quiet: team B's dry run of one ``contains`` reward on one sample (scored in the API, no
      sandbox), sent one after another ``--requests`` times (20); latency per request.
    * flood: team A, from ``--flooders`` threads (8, as in issue 32), each sending a ``python``
      dry run whose grader sleeps ``--grader-seconds`` (2) on each of 3 samples, again and again;
      a 429 is obeyed as a client at its limit does (it waits ``Retry-After``).

    Team B's requests alone (the reference), then the same while team A floods. Printed: B's
    p50/max in both conditions and the flooded/quiet ratio of each (before issue 32's fix, B's
    dry run waited for one of team A's to end: seconds), and team A's answers by status.

Usage
    .venv/bin/python benchmarks/reward_trial_fairness.py [--requests 20] [--flooders 8]
        [--grader-seconds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table  # noqa: E402
from _service_stack import fmt_ms, loadavg, migrated_database, percentiles, uvicorn_server, write_json  # noqa: E402

TRIVIAL = {"rewards": [{"name": "contains", "args": {"text": "4"}}],
           "samples": [{"prompt": "2+2?", "completion": "4"}]}


def make_keys(database_url: str) -> tuple[str, str]:
    """Member keys of two new teams, made through the store as ``grpo admin`` does."""
    from api.store import teams
    from api.store.db import session_scope

    with session_scope(database_url) as session:
        for name in ("flooding", "quiet"):
            teams.create_team(session, name)
        return teams.create_key(session, "flooding")[1], teams.create_key(session, "quiet")[1]


def quiet_latencies(base: str, key: str, requests: int) -> list[float]:
    import httpx

    took = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      trust_env=False) as client:
        for _ in range(requests):
            started = time.perf_counter()
            response = client.post("/v1/rewards/run", json=TRIVIAL)
            response.raise_for_status()
            took.append(time.perf_counter() - started)
    return took


def flood(base: str, key: str, grader_seconds: float, stop: threading.Event, statuses: Counter) -> None:
    import httpx

    source = f"import time\ndef grade(sample, item):\n    time.sleep({grader_seconds})\n    return 1.0\n"
    body = {"rewards": [{"name": "python", "args": {"source": source}}], "reward_timeout_seconds": 30,
            "samples": [{"prompt": "p", "completion": "c"}] * 3}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      trust_env=False) as client:
        while not stop.is_set():
            response = client.post("/v1/rewards/run", json=body)
            statuses[response.status_code] += 1
            if response.status_code == 429:
                stop.wait(float(response.headers.get("Retry-After", "1")))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with migrated_database("postgres") as url, uvicorn_server(url) as (base, _pgid):
        flooding, quiet = make_keys(url)
        quiet_latencies(base, quiet, 2)  # warm-up
        alone = quiet_latencies(base, quiet, args.requests)
        stop, statuses = threading.Event(), Counter()
        flooders = [threading.Thread(target=flood, args=(base, flooding, args.grader_seconds, stop, statuses))
                    for _ in range(args.flooders)]
        for thread in flooders:
            thread.start()
        time.sleep(args.grader_seconds)  # the flood's dry runs are in their graders
        flooded = quiet_latencies(base, quiet, args.requests)
        stop.set()
        for thread in flooders:
            thread.join(120)
    return {"quiet": percentiles(alone), "flooded": percentiles(flooded),
            "flood_statuses": {str(code): count for code, count in sorted(statuses.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--grader-seconds", type=float, default=2.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    result = measure(args)
    quiet, flooded = result["quiet"], result["flooded"]
    rows = [[condition, fmt_ms(figures["p50"]), fmt_ms(figures["max"]),
             f"{figures['p50'] / quiet['p50']:.2f}", f"{figures['max'] / quiet['max']:.2f}"]
            for condition, figures in (("alone", quiet), ("team A flooding", flooded))]
    print(f"{started:%Y-%m-%d %H:%M} UTC, load {loadavg()}, {args.flooders} flooders, "
          f"grader {args.grader_seconds:g} s x 3 samples")
    print(format_table(["team B's dry run", "p50 ms", "max ms", "p50 / alone", "max / alone"], rows))
    print(f"team A's answers by status: {result['flood_statuses']}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
