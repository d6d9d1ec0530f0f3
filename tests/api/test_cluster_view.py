"""``api.cli.cluster_view``: what ``grpo cluster`` and ``grpo queue`` print, checked against exact
text (a job spanning hosts on the cluster view: ``test_gang_views.py``)."""

from __future__ import annotations

from datetime import UTC, datetime

from api.cli.cluster_view import cluster_lines, queue_lines
from api.domain.explanations import PENDING_REASONS


def test_cluster_and_queue_views() -> None:
    now = datetime(2024, 5, 1, 12, 0, 10, tzinfo=UTC)
    cluster = {"pools": [{"name": "default", "held": True, "max_worker_gpus": None, "gpus_total": 0,
                          "gpus_busy": 0, "gpus_free": 0, "waiting": 1, "workers": []}],
               "teams": [{"team": "alpha", "weight": 2.0, "pools": {"default": {
                   "held_gpus": 0, "quota": 4, "fair_share": None, "recent_gpus": 0.0, "waiting": 1}}},
                         {"team": "beta", "weight": 1.0, "pools": {}}],
               "running": []}
    queue = {"updated_at": "2024-05-01T12:00:00Z", "scheduler_pass_at": "2024-05-01T12:00:08Z",
             "waiting": {"default": 1}, "items": []}
    assert cluster_lines(cluster, queue, now) == [
        "Pools",
        "POOL     STATE  GPUS  BUSY  FREE  WAITING  WORKERS  MAX/WORKER",
        "default  held      0     0     0        1        0  -",
        "",
        "Workers",
        "no live workers",
        "",
        "Teams (GPUs held vs quota)",
        "TEAM   WEIGHT  POOL     HELD  QUOTA USE         FAIR SHARE (GPUS)  RECENT (AVG GPUS)  WAITING",
        "alpha       2  default     0  [          ] 0/4  -                                  0        1",
        "beta        1  -           -  -                 -                                  -        -",
        "",
        "Queue (scheduler pass 2s ago, order set 10s ago; waiting per pool: default 1)",
        "no waiting jobs to show",
    ]
    queue["items"] = [{"job_id": 4, "name": "run", "team": "alpha", "pool": "default", "gpus": 1,
                       "priority": "high", "position": 1, "pending_reason": "pool_held"}]
    assert queue_lines(queue, now)[1:] == ["POS  JOB  NAME  TEAM   POOL     GPUS  PRIORITY  WAITS FOR",
                                              "  1    4  run   alpha  default     1  high      pool_held",
                                              "",  # then what each reason shown means
                                              f"pool_held: {PENDING_REASONS['pool_held']}"]
    assert queue_lines(queue, now, 30)[-1] == "pool_held: an admin has held …"
    assert queue_lines({**queue, "scheduler_pass_at": None}, now, 40)[0] == \
        "Queue (scheduler pass never, order set …"
