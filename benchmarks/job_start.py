"""How soon a dispatched job starts training: with the warm spare job process and without it
(and for a job of several devices, with its ranks forked from the rank server or started fresh).

What is measured
    A real worker (Celery, one CPU slot) and scheduler on a throwaway Postgres database and Redis,
    as a deployment runs them. Jobs are submitted one at a time, each once the previous one has
    ended and the worker is idle again for ``--idle`` seconds (a worker between jobs: its next
    pool process has started, and with ``GRPO_WARM_JOB_PROCESS=true`` its spare has had the time
    to import). Per job: ``dispatched_at`` (the scheduler's dispatch, from the job row) to the start
    of its first step (the first metric record's time minus its ``step_time``). The two settings
    alternate job by job (ABAB...) on two workers of two pools, so load from the rest of the
    machine hits both alike; each worker is started once and serves all its jobs.

    Models: ``tiny`` (the tests' tiny Llama, ~1M parameters) and ``realistic`` (the
    ~31M-parameter Qwen2-style model of ``core_vs_trl.py --preset realistic``), one step each.

    ``--gpus 2``: workers of two CPU slots and jobs of two devices, so each job trains on two
    ranks (gloo). ``GRPO_WARM_JOB_PROCESS`` covers both: warm, the spare has started its rank
    server and the ranks are forked from it; cold, a fresh job process starts fresh ranks.

Run: ``.venv/bin/python benchmarks/job_start.py [--jobs 4] [--model tiny|realistic|both] [--gpus 2]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _service_stack import REDIS_URL, ROOT, loadavg, migrated_database, server_env, stop_group, tiny_spec

SETTINGS = {"warm": "true", "cold": "false"}


def _process(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as handle:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _model_folder(kind: str, folder: Path) -> Path:
    if kind == "tiny":
        from grpo_core.io.tiny_models import build_tiny_model

        return build_tiny_model(folder / "tiny", "llama", 64, 2, 4, seed=0)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bench_realistic import build_realistic_model

    return build_realistic_model(folder / "realistic", seed=0)


def _first_step_start(database_url: str, job_id: int) -> float | None:
    from api.store.db import session_scope
    from api.store.jobs import get_job
    from api.store.telemetry import list_metrics

    with session_scope(database_url) as session:
        job = get_job(session, job_id)
        metrics = list_metrics(session, job_id, limit=1)
    if job.status in ("failed", "cancelled"):
        raise RuntimeError(f"job {job_id} {job.status}: {job.error}")
    if not metrics or job.dispatched_at is None:
        return None
    first = metrics[0]
    started = first.ts.timestamp() - float(first.values.get("step_time", 0.0))
    return started - job.dispatched_at.timestamp()


def _wait_done(database_url: str, job_id: int, timeout: float) -> None:
    from api.domain.lifecycle import TERMINAL_STATUSES
    from api.store.db import session_scope
    from api.store.jobs import get_job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with session_scope(database_url) as session:
            job = get_job(session, job_id)
        if job.status in TERMINAL_STATUSES:
            if job.status != "succeeded":
                raise RuntimeError(f"job {job_id} {job.status}: {job.error}")
            return
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")


def measure(model: str, jobs: int, idle: float, logs: Path, gpus: int) -> dict[str, list[float]]:
    from api.domain.job_spec import JobSpec
    from api.store.db import session_scope
    from api.store.jobs import create_job
    from api.store.teams import DEFAULT_TEAM, team_id_by_name

    results: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with migrated_database("postgres") as database_url, tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(model, Path(tmp) / "models")
        namespace = f"bench{uuid.uuid4().hex[:6]}"
        base = server_env(database_url, namespace=namespace, artifacts_root=Path(tmp) / "artifacts",
                          models_root=Path(tmp) / "models", data_root=Path(tmp) / "data",
                          heartbeat_seconds=0.5, scheduler_interval_seconds=0.2, redis_url=REDIS_URL)
        base |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        pools = {name: f"{name}{uuid.uuid4().hex[:4]}" for name in SETTINGS}
        started = []
        try:
            for name, warm in SETTINGS.items():
                env = base | {"GRPO_POOL": pools[name], "GRPO_WARM_JOB_PROCESS": warm,
                              "GRPO_WORKER_GPUS": str(gpus)}
                command = ["-m", "celery", "-A", "worker.celery_app", "worker", "--pool", "prefork",
                           "--without-gossip", "--without-mingle", "--loglevel", "INFO",
                           "-n", f"{pools[name]}@%h"]
                started.append(_process(command, env, logs / f"worker-{name}-{model}.log"))
            scheduler_log = logs / f"scheduler-{model}.log"
            started.append(_process(["-m", "api.cli.main", "scheduler"], base, scheduler_log))
            with session_scope(database_url) as session:
                team = team_id_by_name(session, DEFAULT_TEAM)
            time.sleep(idle)  # both workers up, their first pool processes (and spare) started
            for index in range(2 * jobs):
                name = list(SETTINGS)[index % 2]
                spec = tiny_spec(f"start-{name}-{index}", pool=pools[name], max_steps=1,
                                 resources={"pool": pools[name], "gpus": gpus})
                spec["model"] = {"source": f"path:{folder.name}"}
                with session_scope(database_url) as session:
                    job, _ = create_job(session, team, JobSpec.model_validate(spec))
                _wait_done(database_url, job.id, 600)
                latency = _first_step_start(database_url, job.id)
                assert latency is not None, f"job {job.id} has no step"
                results[name].append(latency)
                print(f"  {model} {name}: job {job.id} first step {latency:.2f} s after dispatch "
                      f"(load {loadavg()})", flush=True)
                time.sleep(idle)
        finally:
            for process in started:
                stop_group(process, signal.SIGTERM)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs per setting and model")
    parser.add_argument("--model", choices=["tiny", "realistic", "both"], default="both")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds a worker is idle between jobs")
    parser.add_argument("--gpus", type=int, default=1, help="devices (CPU slots) per worker and per job")
    parser.add_argument("--logs", type=Path, default=None)
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="job-start-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs, load {loadavg()}; logs in {logs}")
    models = ["tiny", "realistic"] if args.model == "both" else [args.model]
    rows = []
    for model in models:
        results = measure(model, args.jobs, args.idle, logs, args.gpus)
        cold, warm = statistics.median(results["cold"]), statistics.median(results["warm"])
        rows.append((model, cold, warm, cold / warm, results))
    print(f"\nmodel      dispatched -> first step (median s), {args.gpus} device(s) a job   cold / warm")
    print("           cold (fresh process)   warm (spare)")
    for model, cold, warm, ratio, results in rows:
        print(f"{model:<10} {cold:>8.2f}              {warm:>8.2f}       {ratio:.2f}x   "
              f"(cold {', '.join(f'{v:.2f}' for v in results['cold'])}; "
              f"warm {', '.join(f'{v:.2f}' for v in results['warm'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
