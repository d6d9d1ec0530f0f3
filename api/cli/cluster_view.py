"""What ``grpo cluster`` and ``grpo queue`` print, as pure functions from the API's JSON to text:
the pools, the workers and each of their devices, every team's GPUs against its quota and fair
share, the running jobs and the scheduler's queue. Built on :mod:`api.cli.term_view`'s tables and
bars; no I/O here either (the caller passes the width and the time).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from api.cli.term_view import ago, bar, clip, pending_legend, placement_text, table


def _usage(held: int, quota: int | None) -> str:
    if quota is None:
        return f"{held}/-"
    return f"[{bar(held / quota if quota else 1.0, 10)}] {held}/{quota}"


def _devices(worker: dict[str, Any]) -> str:
    """``0:12,1:free``: each device and its job (``busy``: another team's); a job spanning hosts
    says its node rank on this worker and how many hosts it spans (``0:12(node 1/2)``)."""
    gangs = {gang["job_id"]: f"(node {gang['node_rank']}/{gang['hosts']})"
             for gang in worker.get("gangs") or ()}
    return ",".join(f"{d['index']}:{d['job_id'] or ('busy' if d['busy'] else 'free')}"
                    f"{gangs.get(d['job_id'], '')}" for d in worker["devices"])


def _running_on(job: dict[str, Any]) -> str | None:
    """Every worker and its devices (a server from before placements: its one worker's)."""
    if job.get("placement"):
        return placement_text(job["placement"])
    if job["worker_id"] is None:
        return None
    return placement_text([{"worker": job["worker_id"], "devices": job["devices"]}])


def cluster_lines(cluster: dict[str, Any], queue: dict[str, Any], now: datetime, width: int | None = None
                  ) -> list[str]:
    """``grpo cluster``: pools, workers, every team's GPUs against its quota, running jobs, queue."""
    pools = [[pool["name"], "held" if pool["held"] else "open", pool["gpus_total"], pool["gpus_busy"],
              pool["gpus_free"], pool["waiting"], len(pool["workers"]), pool["max_worker_gpus"]]
             for pool in cluster["pools"]]
    workers = [[worker["worker_id"], pool["name"], worker["gpus"], worker["gpu_model"],
                worker["gpu_memory_mb"], "busy" if worker["busy"] else "idle", _devices(worker),
                worker["hostname"]]
               for pool in cluster["pools"] for worker in pool["workers"]]
    teams = [[team["team"], team["weight"], pool, usage["held_gpus"],
              _usage(usage["held_gpus"], usage["quota"]), usage["fair_share"], usage["recent_gpus"],
              usage["waiting"]]
             for team in cluster["teams"] for pool, usage in team["pools"].items()]
    teams += [[team["team"], team["weight"], *[None] * 6] for team in cluster["teams"] if not team["pools"]]
    running = [[job["job_id"], job["team"], job["pool"], job["gpus"], job["priority"], job["status"],
                _running_on(job), "yes" if job["preempt_requested"] else None] for job in cluster["running"]]
    out = ["Pools", *table(["POOL", "STATE", "GPUS", "BUSY", "FREE", "WAITING", "WORKERS", "MAX/WORKER"],
                           pools, width)]
    headers = ["WORKER", "POOL", "GPUS", "MODEL", "GPU MB", "STATE", "DEVICE:JOB", "HOST"]
    out += ["", "Workers", *(table(headers, workers, width) if workers else ["no live workers"])]
    out += ["", "Teams (GPUs held vs quota)",
            *table(["TEAM", "WEIGHT", "POOL", "HELD", "QUOTA USE", "FAIR SHARE (GPUS)", "RECENT (AVG GPUS)",
                    "WAITING"], teams, width)]
    if running:
        headers = ["JOB", "TEAM", "POOL", "GPUS", "PRIORITY", "STATUS", "WORKERS [DEVICES]", "PREEMPTING"]
        out += ["", "Running", *table(headers, running, width)]
    return [*out, "", *queue_lines(queue, now, width)]


def queue_lines(queue: dict[str, Any], now: datetime, width: int | None = None) -> list[str]:
    """``grpo queue``: the scheduler's dispatch order of the jobs the key may see, and how many
    wait per pool in all."""
    waiting = ", ".join(f"{pool} {count}" for pool, count in queue["waiting"].items()) or "none"
    head = (f"Queue (scheduler pass {ago(queue['scheduler_pass_at'], now)}, order set "
            f"{ago(queue['updated_at'], now)}; waiting per pool: {waiting})")
    rows = [[entry["position"], entry["job_id"], entry["name"], entry["team"], entry["pool"], entry["gpus"],
             entry["priority"], entry["pending_reason"]] for entry in queue["items"]]
    if not rows:
        return [clip(head, width), "no waiting jobs to show"]
    headers = ["POS", "JOB", "NAME", "TEAM", "POOL", "GPUS", "PRIORITY", "WAITS FOR"]
    legend = pending_legend([entry["pending_reason"] for entry in queue["items"]], width)
    return [clip(head, width), *table(headers, rows, width), *(["", *legend] if legend else [])]
