"""``api.cli.term_view``: what the monitoring commands print, as pure functions checked against
hand-computed text (sparkline heights, bar eighths, table padding, the watch frame)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api.cli import term_view as tv
from api.domain.explanations import ERROR_CODES, PENDING_REASONS

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(("values", "width", "expected"), [
    ([0, 1, 2, 3], None, "▁▃▆█"),  # 0, 7/3 -> 2, 14/3 -> 5, 7
    ([0, 1, 2], None, "▁▅█"),  # 3.5 rounds half up, to 4
    ([-1.0, 1.0], None, "▁█"),
    ([5, 5, 5], None, "▄▄▄"),  # a constant series is a flat line at mid height
    ([0, 0.0, -0.0], None, "▁▁▁"),  # ... but at 0 it lies on the floor: nothing happens
    ([0, None, 0], None, "▁ ▁"),
    ([0, None, NAN, INF, 1], None, "▁   █"),  # a gap for each missing or non-finite value
    ([None, NAN], None, "  "),
    ([1, True, 2], None, "▁ █"),  # a bool is not a measurement
    ([], None, ""),
    ([100, 0, 1, 2, 3], 4, "▁▃▆█"),  # the newest 4 only, scaled among themselves
    ([0, 1], 0, ""),
    ([0, 1], 5, "▁█"),
])
def test_sparkline(values, width, expected) -> None:
    assert tv.sparkline(values, width) == expected


@pytest.mark.parametrize(("fraction", "width", "expected"), [
    (0.35, 10, "███▌      "),  # 28 eighths: 3 cells and a half
    (0.0, 4, "    "),
    (1.0, 4, "████"),
    (1.5, 4, "████"),
    (-1.0, 4, "    "),
    (NAN, 4, "    "),
    (0.999, 2, "█▉"),  # 15.98 eighths, rounded down: never fuller than done
    (1 / 3, 3, "█  "),
    (0.5, 0, ""),
])
def test_bar(fraction, width, expected) -> None:
    assert tv.bar(fraction, width) == expected


def test_progress() -> None:
    assert tv.progress(7, 20, 10) == "[███▌      ] 7/20  35%"
    assert tv.progress(0, 20, 4) == "[    ] 0/20   0%"
    assert tv.progress(20, 20, 4) == "[████] 20/20 100%"
    assert tv.progress(25, 20, 4) == "[████] 25/20 100%"
    assert tv.progress(3, None) == tv.progress(3, 0) == "step 3"


def test_num_clip_and_times() -> None:
    assert [tv.num(v) for v in (0.123456, 1e-7, 0.0, 5, None, "x", NAN)] == \
        ["0.1235", "1e-07", "0", "5", "-", "x", "nan"]
    assert (tv.clip("abcdef", 4), tv.clip("abc", 3), tv.clip("abc", None), tv.clip("abc", 0)) == \
        ("abc…", "abc", "abc", "")
    assert tv.when("2024-05-01T12:00:03.5Z") == tv.when("2024-05-01T12:00:03.5") == "2024-05-01 12:00:03"
    assert tv.when(None) == "-"
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    assert [tv.ago(stamp, now) for stamp in ("2024-05-01T11:59:18Z", "2024-05-01T11:55:00+00:00",
                                             "2024-05-01T09:00:00Z", "2024-04-28T12:00:00Z",
                                             "2024-05-01T12:00:05Z", None)] == \
        ["42s ago", "5m ago", "3h ago", "3d ago", "0s ago", "never"]


def test_table_pads_aligns_and_cuts() -> None:
    lines = tv.table(["ID", "NAME", "VALUE"], [[1, "alpha", 0.123456], [22, None, 3.0], [3, "b", None]])
    assert lines == ["ID  NAME    VALUE",
                     " 1  alpha  0.1235",
                     "22  -           3",
                     " 3  b           -"]
    mixed = tv.table(["A", "B"], [[1, "x"], ["two", 2]])  # a column with text in it stays left
    assert mixed == ["A    B", "1    x", "two  2"]
    cut = tv.table(["ID", "MESSAGE"], [[1, "a long message here"]], max_width=12)
    assert cut == ["ID  MESSAGE", " 1  a long …"]
    assert tv.table(["ONLY"], []) == ["ONLY"]


def test_step_line() -> None:
    metrics = {"type": "metrics", "step": 3, "values": {"step": 3, "reward": 0.25, "kl": 0.0012,
                                                        "clip_ratio/region_mean": 0.05}}
    assert tv.step_line(metrics, 20) == "step      3/20  reward 0.25  kl 0.0012  clip 0.05  loss -"
    assert tv.step_line(metrics).startswith("step         3  reward")
    event = {"type": "event", "event": {"type": "checkpoint", "message": "saved step 3"}}
    assert tv.step_line(event) == "[checkpoint] saved step 3"
    assert tv.step_line({"type": "event", "event": {"type": "debug_note", "message": "x"}}) is None
    assert tv.step_line({"type": "status", "status": "running"}) == "status: running"
    assert tv.step_line({"type": "status", "status": "succeeded"}) is None
    assert tv.step_line({"type": "samples", "step": 3, "rows": []}) is None


def test_an_eval_points_step_line_and_table_columns() -> None:
    before = {"type": "metrics", "step": 0, "values": {"step": 0, "eval_reward": 0.5, "eval_pass@k": 0.25}}
    assert tv.step_line(before, 4) == "step       0/4  eval_reward 0.5  eval_pass@k 0.25"
    last = {"type": "metrics", "step": 4, "values": {"step": 4, "reward": 0.75, "eval_reward": 1.0}}
    assert tv.step_line(last, 4).endswith("loss -  eval_reward 1  eval_pass@k -")
    records = [{"step": 0, "values": before["values"]}, {"step": 1, "values": {"step": 1, "reward": 0.5}},
               {"step": 2, "values": {"step": 2, "reward": 0.5, "eval_reward": 0.75, "eval_reward_std": 0.1,
                                      "eval_rewards/exact/mean": 0.5, "eval_rewards/exact/std": 0.0}}]
    assert tv.metrics_table(records) == ["STEP  reward  eval_reward  eval_pass@k", "   0       -          0.5"
                                         "         0.25", "   1     0.5            -            -",
                                         "   2     0.5         0.75            -"]
    points = tv.eval_points(records)
    assert [record["step"] for record in points] == [0, 2]
    assert tv.eval_metric_names(points) == ["eval_reward", "eval_reward_std", "eval_pass@k",
                                            "eval_rewards/exact/mean"]


def metrics(step: int, **values) -> dict:
    return {"type": "metrics", "step": step, "values": {"step": step, **values}}


def test_watch_view_frame() -> None:
    view = tv.WatchView.of({"id": 7, "name": "tiny", "status": "queued", "max_steps": 8, "last_step": 0})
    # 59 columns drawn (never the last: it would wrap); the bar gets 59 - 24 = 35 cells
    assert view.lines(60) == ["job 7 tiny · queued", "[" + " " * 35 + "] 0/8   0%",
                              "reward            -", "KL                -", "clipfrac          -"]
    view.update({"type": "status", "status": "running", "job": {"name": "tiny", "status": "running",
                                                               "max_steps": 8, "last_step": 0}})
    for step in range(1, 5):
        view.update(metrics(step, reward=float(step - 1), kl=0.5, **{"clip_ratio/region_mean": None}))
    view.update(metrics(4, reward=99.0))  # a step seen again (a reconnect) changes nothing
    view.update({"type": "event", "event": {"type": "checkpoint", "message": "saved step 4"}})
    view.update({"type": "event", "event": {"type": "debug_note", "message": "not shown"}})
    assert view.lines(60) == [
        "job 7 tiny · running",
        "[█████████████████▌                 ] 4/8  50%",  # 17.5 of 35 cells
        "reward            3  ▁▃▆█  0..3",
        "KL              0.5  ▄▄▄▄",  # no range for a constant
        "clipfrac          -",
        "[checkpoint] saved step 4",
    ]
    narrow = view.lines(30)
    assert all(len(line) <= 29 for line in narrow)
    assert narrow[1:3] == ["[█████     ] 4/8  50%", "reward            3  ▁▃▆█"]  # no room for the range


def test_watch_view_keeps_a_bounded_history() -> None:
    view = tv.WatchView(job_id=1, history=3)
    for step in range(1, 11):
        view.update(metrics(step, reward=float(step)))
    assert list(view.series["reward"]) == [8.0, 9.0, 10.0] and view.step == 10
    assert view.lines(80)[1] == "step 10"  # no max_steps known


def test_repaint_moves_up_over_the_last_frame() -> None:
    assert tv.repaint(0, ["a", "b"]) == "a\nb\n"
    assert tv.repaint(2, ["c"]) == "\x1b[2A\r\x1b[Jc\n"


JOB = {"id": 4, "name": "run", "team_id": 2, "status": "queued", "priority": "high", "pool": "default",
       "gpus": 1, "attempt": 0, "worker_id": None, "max_steps": 10, "last_step": 0, "cancel_requested": False,
       "preempt_requested": False, "pending_reason": "no_workers", "queue_position": 2,
       "created_at": "2024-05-01T12:00:00Z", "dispatched_at": None, "started_at": None, "finished_at": None,
       "heartbeat_at": None, "latest_checkpoint": None, "error": None, "spec": {}}


def test_job_views() -> None:
    assert tv.jobs_table([JOB, {**JOB, "id": 5, "tags": ["exp-1", "ab"]}]) == [
        "ID  NAME  STATUS  STEP  POOL     GPUS  PRIORITY  CREATED              WAITS          TAGS",
        " 4  run   queued  0/10  default     1  high      2024-05-01 12:00:00  #2 no_workers  -",
        " 5  run   queued  0/10  default     1  high      2024-05-01 12:00:00  #2 no_workers  exp-1,ab"]
    failed = {**JOB, "status": "failed", "attempt": 1, "worker_id": "w1", "last_step": 5,
              "queue_position": None, "pending_reason": None, "finished_at": "2024-05-01T12:05:00Z",
              "error": {"code": "non_finite_loss", "message": "loss is nan"}}
    assert tv.job_details(failed) == [
        "job 4  run",
        "status      failed (attempt 1, worker w1)",
        "progress    [███████████████               ] 5/10  50%",
        "placement   pool default, 1 GPU(s), priority high",
        "team        2",
        "created     2024-05-01 12:00:00",
        "finished    2024-05-01 12:05:00",
        "error       [non_finite_loss] loss is nan",
        f"meaning     {ERROR_CODES['non_finite_loss']}",
    ]
    assert tv.final_line(failed) == "job 4 failed at step 5 [non_finite_loss] loss is nan"
    assert tv.job_details(JOB)[5] == f"waits       #2 no_workers: {PENDING_REASONS['no_workers']}"


def test_a_success_with_unscored_rows_reads_as_succeeded_with_warnings() -> None:
    done = {**JOB, "status": "succeeded", "attempt": 1, "worker_id": "w1", "last_step": 10,
            "queue_position": None, "pending_reason": None, "unscored_rows": 6,
            "status_label": "succeeded with warnings"}  # as the API's JobRead labels it
    details = tv.job_details(done)
    assert details[1] == "status      succeeded with warnings (attempt 1, worker w1)"
    assert "unscored    6 row(s) the rewards could not score (`grpo events` says why)" in details
    assert tv.final_line(done) == "job 4 succeeded with warnings at step 10"
    plain = {**done, "unscored_rows": 0, "status_label": "succeeded"}
    assert tv.final_line(plain) == "job 4 succeeded at step 10"


def test_event_and_metric_tables() -> None:
    event = {"id": 9, "ts": "2024-05-01T12:00:01Z", "level": "info", "type": "running", "message": "claimed"}
    assert tv.events_table([event]) == ["ID  TIME                 LEVEL  TYPE     MESSAGE",
                                        " 9  2024-05-01 12:00:01  info   running  claimed"]
    records = [{"step": 1, "values": {"step": 1, "zeta": 1, "reward": 0.5, "kl": 0.01}},
               {"step": 2, "values": {"step": 2, "alpha": 2.0, "reward": 0.75}}]
    assert tv.metric_names(records) == ["alpha", "kl", "reward", "zeta"]
    assert tv.metrics_table(records) == ["STEP  reward    kl", "   1     0.5  0.01", "   2    0.75     -"]
    assert tv.metrics_table(records, ["zeta", "alpha"]) == ["STEP  zeta  alpha", "   1     1      -",
                                                            "   2     -      2"]
    assert tv.metrics_table([{"step": 1, "values": {"odd": 1}}]) == ["STEP  odd", "   1    1"]
