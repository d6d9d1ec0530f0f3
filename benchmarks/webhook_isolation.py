"""Does one team's slow webhook receivers delay another team's deliveries? (issue 32, item 3)

Through the real sender: ``grpo scheduler`` (``python -m api.cli.main scheduler``) runs in its own
process group against a migrated Postgres (or SQLite) database and this machine's Redis, with the
operator's settings in ``GRPO_*`` (loopback allowed, since the receivers listen here). Team A has
32 webhooks: 24 receivers that never answer (the sender's deadline cuts them) and 8 that trickle
their answer a byte every 2 s. Team B has one receiver that answers 204 at once.

Each round commits one ``job.succeeded`` event of team B through the real outbox
(:func:`api.store.webhooks.enqueue_job_event`, what a job's final transition calls) and times it
until B's receiver has the request. *quiet*: A sends nothing. *loaded*: before each B round, A's
job ends too (32 more deliveries of A, every receiver hanging or trickling, and A's failed ones
come back after ``GRPO_WEBHOOK_RETRY_SECONDS=1``), so A always has more due than its slots. The
figure is B's latency loaded minus quiet (target: within 1 s), measured in the same run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/webhook_isolation.py [--rounds 12] [--backend postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _service_stack import ROOT, migrated_database, server_env, stop_group, tiny_spec  # noqa: I001

sys.path.append(str(ROOT / "tests"))
from webhook_receiver import webhook_receiver  # noqa: E402

from api.domain.job_spec import JobSpec  # noqa: E402
from api.schemas.jobs import JobRead  # noqa: E402
from api.security.secret_box import SecretBox  # noqa: E402
from api.store.db import session_scope  # noqa: E402
from api.store.jobs import create_job  # noqa: E402
from api.store.teams import create_team  # noqa: E402
from api.store.webhooks import create_webhook, enqueue_job_event  # noqa: E402

KEY = "mbdUdtmXOnOAOSz9sFWIAN0z39VYGg_4p2JGwz0bRIo="  # a Fernet key, for this benchmark only
HANGING, TRICKLING = 24, 8


def team_with_job(url: str, name: str) -> tuple[int, JobRead]:
    with session_scope(url) as session:
        team = create_team(session, name)
        job, _ = create_job(session, team.id, JobSpec.model_validate(tiny_spec(f"{name}-job")))
    return team.id, job


def register(url: str, team_id: int, receiver_url: str) -> None:
    with session_scope(url) as session:
        create_webhook(session, team_id, receiver_url, ["job.succeeded"], SecretBox(KEY), 100)


def enqueue(url: str, job: JobRead) -> None:
    with session_scope(url) as session:
        enqueue_job_event(session, job, "job.succeeded")


def b_latency(url: str, job: JobRead, quiet_receiver, timeout: float = 60.0) -> float:
    """One B event, committed, until its receiver holds it: seconds."""
    before = len(quiet_receiver.seen)
    started = time.monotonic()
    enqueue(url, job)
    while len(quiet_receiver.seen) == before:
        if time.monotonic() - started > timeout:
            raise RuntimeError("team B's delivery did not arrive within a minute")
        time.sleep(0.005)
    return time.monotonic() - started


@contextlib.contextmanager
def scheduler(url: str, log: Path, team_cap: int):
    env = {**server_env(url, secret_key=KEY, webhook_allowed_networks="127.0.0.0/8",
                        webhook_max_in_flight_per_team=team_cap,
                        webhook_poll_seconds=0.1, webhook_retry_seconds=1, webhook_retry_max_seconds=1),
           "PYTHONPATH": str(ROOT)}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "api.cli.main", "scheduler"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield process
        finally:
            stop_group(process, signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--team-cap", type=int, default=4, help="GRPO_WEBHOOK_MAX_IN_FLIGHT_PER_TEAM; "
                        "32 (the process's whole GRPO_WEBHOOK_MAX_IN_FLIGHT) shows the run without one")
    args = parser.parse_args()
    release = threading.Event()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(migrated_database(args.backend))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="grpo-bench-hooks-")))
        a_team, a_job = team_with_job(url, "loud")
        b_team, b_job = team_with_job(url, "quiet")
        loud = []
        for n in range(HANGING + TRICKLING):
            receiver = stack.enter_context(webhook_receiver())
            loud.append(receiver)
            receiver.always = ("block", release) if n < HANGING else ("trickle", 2.0)
            register(url, a_team, receiver.url)
        quiet = stack.enter_context(webhook_receiver())
        register(url, b_team, quiet.url)
        stack.callback(release.set)
        stack.enter_context(scheduler(url, folder / "scheduler.log", args.team_cap))
        b_latency(url, b_job, quiet)  # warm-up: the scheduler is up and its sender polling
        quiet_s = []
        for _ in range(args.rounds):
            quiet_s.append(b_latency(url, b_job, quiet))
            time.sleep(0.2)
        loaded_s = []
        for _ in range(args.rounds):
            enqueue(url, a_job)
            time.sleep(0.5)  # A's new deliveries taken and hanging before B's is committed
            loaded_s.append(b_latency(url, b_job, quiet))
        a_requests = sum(len(r.seen) for r in loud)
    q, lo = statistics.median(quiet_s), statistics.median(loaded_s)
    print(f"backend {args.backend}, {args.rounds} rounds each, per-team cap {args.team_cap}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"team A: {HANGING} hanging + {TRICKLING} trickling receivers, {args.rounds} events x "
          f"{HANGING + TRICKLING} deliveries while loaded, {a_requests} requests reached them")
    print(f"team B delivery latency  quiet  median {q * 1000:7.0f} ms  max {max(quiet_s) * 1000:7.0f} ms")
    print(f"team B delivery latency  loaded median {lo * 1000:7.0f} ms  max {max(loaded_s) * 1000:7.0f} ms")
    print(f"difference (loaded - quiet): median {(lo - q) * 1000:+.0f} ms, "
          f"max {(max(loaded_s) - max(quiet_s)) * 1000:+.0f} ms (target: within 1,000 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
