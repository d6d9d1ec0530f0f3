"""Jobs that span hosts (issue 27): how long a gang takes to form, and what a step costs on
2 hosts x 1 slot against 1 host x 2 slots (the same total), through the real service.

What runs
    The real stack on this machine: a Postgres database migrated to head, Redis, an S3 bucket on
    moto's server (``tests/storage_server.py``, its own process), the scheduler (``grpo
    scheduler``) and Celery workers (``celery -A worker.celery_app worker``), each its own process
    group, each worker with its own artifacts folder (all the hosts share is the bucket). One job,
    ``resources.gpus: 2``, the same in both layouts: a random-init model
    (``grpo_core.io.tiny_models``, ``--hidden-size``/``--num-layers``), 8 prompts x 4 completions
    per step, ``--steps`` steps, fp32 on CPU, gloo:

    * ``one_host``: one worker with ``GRPO_WORKER_GPUS=2``: the job's 2 ranks on one host (the
      reference; what a pool whose largest worker is big enough runs).
    * ``two_hosts``: two workers with one slot each: the job is a gang; node 0 claims it, the
      other joins, node 0 publishes its rendezvous, each host's job process starts its rank, and
      the two ranks form one process group across the hosts (here: two processes on the same
      machine over TCP loopback, as they would over a network).

How it is measured
    * formation: from the job's ``dispatched`` event to its ``started`` event (SQL timestamps,
      the database's clock): for a gang, every host's message delivered, claim and join, the
      rendezvous published and met, the model loaded on every rank; for one host the same minus
      the gang's part. Also ``first step``: dispatched to the first step's record.
    * step time: median of the records' ``step_time`` after ``--warmup`` steps (the trainer's own
      per-step clock on rank 0, every collective included).
    * ``--repeats`` runs of each layout, alternating (ABBA); the medians pool the repeats. The
      machine has 2 cores: both layouts run 2 ranks on the same 2 cores, so the ratio is what
      spanning hosts costs (a process group over TCP instead of within one launcher, two job
      processes, the join and the rendezvous), not a speed-up.

Usage
    PYTHONPATH=$PWD .venv/bin/python benchmarks/gang_jobs.py [--steps 12 --warmup 2 --repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import format_table
from _service_stack import REDIS_URL, ROOT, loadavg, migrated_database, server_env, stop_group, tiny_spec

sys.path.append(str(ROOT / "tests"))
from storage_server import s3_server  # noqa: E402 - tests/ is a plain folder of helpers too

LAYOUTS = {"one_host": [2], "two_hosts": [1, 1]}  # slots per worker


def stack_env(database_url: str, storage: dict[str, str], models: Path, data: Path) -> dict[str, str]:
    """Every service process's environment: the benchmarks' own (``server_env``) plus this stack's."""
    return {**server_env(database_url, models_root=models, data_root=data, heartbeat_seconds=0.5,
                         scheduler_interval_seconds=0.2, rank_timeout_seconds=300),
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT), **storage}


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen]]:
    """The processes started in the block, each its own group, stopped (TERM, then KILL) at its end."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for process in started:
            stop_group(process, signal.SIGTERM)


def start(started: list[subprocess.Popen], args: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("w") as handle:
        started.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=handle,
                                        stderr=subprocess.STDOUT, start_new_session=True))


def run_layout(layout: str, args: argparse.Namespace, base_env: dict[str, str],
               folder: Path) -> dict[str, Any]:
    """One job of ``resources.gpus: 2`` through a fresh pool of ``layout``'s workers."""
    from api.domain.job_spec import JobSpec
    from api.settings import Settings
    from api.store.bus import connect, live_workers
    from api.store.db import session_scope
    from api.store.jobs import create_job, get_job
    from api.store.teams import DEFAULT_TEAM, team_id_by_name
    from api.store.telemetry import list_events, list_metrics

    pool = f"bench{uuid.uuid4().hex[:6]}"
    url = base_env["GRPO_DATABASE_URL"]
    logs = folder / f"logs-{pool}"
    logs.mkdir()
    with processes() as started:
        start(started, ["-m", "api.cli.main", "scheduler"], base_env, logs / "scheduler.log")
        for index, slots in enumerate(LAYOUTS[layout]):
            env = {**base_env, "GRPO_POOL": pool, "GRPO_WORKER_GPUS": str(slots),
                   "GRPO_WORKER_ID": f"{pool}-host{index}",
                   "GRPO_ARTIFACTS_ROOT": str(folder / f"{pool}-{index}")}
            start(started, ["-m", "celery", "-A", "worker.celery_app", "worker", "--pool", "prefork",
                            "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
                            "-n", f"{pool}-{index}@%h"], env, logs / f"worker{index}.log")
        settings = Settings(database_url=url, redis_url=REDIS_URL)
        client = connect(settings)
        deadline = time.monotonic() + 120
        def live() -> int:
            return len([w for w in live_workers(client, settings.redis_keys) if w.pool == pool])

        while live() < len(LAYOUTS[layout]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start; see {logs}")
            time.sleep(0.2)
        spec = tiny_spec(f"gang-{layout}", resources={"pool": pool, "gpus": 2}, checkpoint_every=1000,
                         grpo={"max_steps": args.steps, "prompts_per_step": 8, "num_generations": 4,
                               "max_completion_length": 16})
        with session_scope(url) as session:
            job, _ = create_job(session, team_id_by_name(session, DEFAULT_TEAM), JobSpec.model_validate(spec))
        deadline = time.monotonic() + args.timeout
        while True:
            with session_scope(url) as session:
                done = get_job(session, job.id)
            if done.status in ("succeeded", "failed", "cancelled"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job.id} did not end in {args.timeout} s; see {logs}")
            time.sleep(0.5)
        if done.status != "succeeded":
            raise RuntimeError(f"job {job.id} {done.status}: {done.error}; see {logs}")
        with session_scope(url) as session:
            events = {e.type: e.ts for e in reversed(list_events(session, job.id, limit=1000))}
            records = list_metrics(session, job.id)
    steps = [m.values["step_time"] for m in records if m.step > args.warmup]
    dispatched = events["dispatched"]
    return {"layout": layout, "hosts": len(done.placement),
            "formation_s": (events["started"] - dispatched).total_seconds(),
            "first_step_s": (records[0].ts - dispatched).total_seconds(), "step_times": steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    from grpo_core.io.tiny_models import build_tiny_model

    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="gang-bench-") as tmp, migrated_database("postgres") as url, \
            s3_server() as bucket:
        folder = Path(tmp)
        models, data = folder / "models", folder / "data"
        data.mkdir()
        build_tiny_model(models / "tiny", hidden_size=args.hidden_size, num_layers=args.num_layers)
        storage = {"GRPO_STORAGE_URL": bucket.url(f"b-{uuid.uuid4().hex[:8]}"), **bucket.env}
        env = stack_env(url, storage, models, data)
        order = list(LAYOUTS)
        for repeat in range(args.repeats):
            for layout in order if repeat % 2 == 0 else order[::-1]:
                result = run_layout(layout, args, env, folder)
                runs[layout].append(result)
                print(f"  {layout} run {repeat + 1}: formation {result['formation_s']:.2f} s, "
                      f"step {statistics.median(result['step_times']) * 1000:.0f} ms", flush=True)
    rows, reference = [], None
    for layout in LAYOUTS:
        formation = statistics.median(r["formation_s"] for r in runs[layout])
        first = statistics.median(r["first_step_s"] for r in runs[layout])
        step = statistics.median(t for r in runs[layout] for t in r["step_times"])
        reference = reference or (formation, step)
        rows.append([layout, runs[layout][0]["hosts"], f"{formation:.2f}", f"{first:.2f}",
                     f"{step * 1000:.0f}", f"{formation / reference[0]:.2f}", f"{step / reference[1]:.2f}"])
    print(f"\nload before: {load_before}, after: {loadavg()}; {args.repeats} repeats x {args.steps} steps "
          f"(warmup {args.warmup}); "
          f"model hidden {args.hidden_size} x {args.num_layers} layers")
    print(format_table(["layout", "hosts", "formation s", "to 1st step s", "step ms", "formation/ref",
                        "step/ref"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
