"""What ``grpo``'s monitoring commands print, as pure functions from the API's JSON to text:
progress bars, sparklines, tables, the live ``grpo watch`` frame and its ANSI repaint. No I/O and
no terminal state here (the caller passes the width and the time), so each is tested by its
output alone.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from api.domain.explanations import ALERT_RULES, error_code_text, pending_reason_text
from api.domain.lifecycle import TERMINAL_STATUSES

NOTABLE_EVENTS = ("running", "requeued", "resumed", "checkpoint", "stopped", "cancel_requested",
                  "preempt_requested", "preempted", "priority_changed")
STEP_LINE_METRICS = (("reward", "reward"), ("kl", "kl"), ("clip_ratio/region_mean", "clip"), ("loss", "loss"))
WATCH_SERIES = (("reward", "reward"), ("kl", "KL"), ("clip_ratio/region_mean", "clipfrac"))
WATCH_EVAL_LABEL = "eval reward"  # a row of its own once the job has evaluated
TABLE_METRICS = ("reward", "reward_std", "kl", "clip_ratio/region_mean", "loss", "entropy", "grad_norm",
                 "completions/mean_length", "step_time")
# An eval point's record holds these (grpo_core's eval_metrics); a training step's never does.
EVAL_MARK = "eval_reward"
EVAL_SUMMARY = ("eval_reward", "eval_pass@k")  # beside training's columns, and on a step's line
EVAL_TABLE_METRICS = ("eval_reward", "eval_reward_std", "eval_pass@k", "eval_completions/mean_length",
                      "eval_completions/clipped_ratio", "timing/eval")
EVAL_REWARD_FN = re.compile(r"^eval_rewards/.+/mean$")
SPARKS = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉"  # index k: k/8 of a cell
ELLIPSIS = "…"


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (missing, NaN, inf, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def num(value: Any) -> str:
    """A metric for people: 4 significant digits; ``-`` for nothing; text as it is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def clip(text: str, width: int | None) -> str:
    """``text`` cut to ``width`` characters, the last one ``…`` when anything was cut (None: as is)."""
    if width is None:
        return text
    if width <= 0:
        return ""
    return text if len(text) <= width else text[:width - 1] + ELLIPSIS


def sparkline(values: Sequence[Any], width: int | None = None) -> str:
    """One character per value, the newest ``width`` only, heights scaled from the lowest value
    shown (``▁``) to the highest (``█``); a gap for a missing or non-finite value. A constant
    series has no scale: at 0 it is a line on the floor (``▁``), so no clipping or no KL reads as
    nothing, and at any other value a flat line at mid height (``▄``)."""
    if width is not None and width <= 0:
        return ""
    shown = [finite(value) for value in (values[-width:] if width else values)]
    present = [value for value in shown if value is not None]
    if not present:
        return " " * len(shown)
    low, high, top = min(present), max(present), len(SPARKS) - 1

    def glyph(value: float | None) -> str:
        if value is None:
            return " "
        if high == low:
            return SPARKS[0] if low == 0 else SPARKS[top // 2]
        return SPARKS[int((value - low) / (high - low) * top + 0.5)]

    return "".join(glyph(value) for value in shown)


def bar(fraction: float, width: int) -> str:
    """``width`` cells filled from the left to ``fraction`` (clamped to [0, 1]) in eighths of a
    cell, rounded down: a bar is never fuller than the work done."""
    if width <= 0:
        return ""
    done = min(max(finite(fraction) or 0.0, 0.0), 1.0)
    full, part = divmod(int(done * width * 8 + 1e-9), 8)
    return ("█" * full + (EIGHTHS[part] if part else "")).ljust(width)


def progress(step: int, total: int | None, width: int = 30) -> str:
    """``[████▌     ] 9/20  45%``; ``step 9`` when the total is unknown."""
    if not total:
        return f"step {step}"
    return f"[{bar(step / total, width)}] {step}/{total} {100 * min(step, total) // total:3d}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int | None = None) -> list[str]:
    """Columns padded to their widest cell, two spaces apart; a column of numbers is aligned
    right, others left. Cells go through :func:`num`. Lines are cut to ``max_width``."""
    cells = [[num(value) for value in row] for row in rows]
    numeric = [all(finite(row[i]) is not None or row[i] is None for row in rows) and
               any(row[i] is not None for row in rows) for i in range(len(headers))]
    widths = [max(len(text) for text in [header, *(row[i] for row in cells)])
              for i, header in enumerate(headers)]

    def line(texts: Sequence[str]) -> str:
        padded = [text.rjust(w) if right else text.ljust(w) for text, w, right in zip(texts, widths, numeric,
                                                                                          strict=True)]
        return clip("  ".join(padded).rstrip(), max_width)

    return [line(headers), *(line(row) for row in cells)]


def when(stamp: str | None) -> str:
    """An API timestamp (ISO 8601, UTC) as ``2024-05-01 12:00:03``; ``-`` for none."""
    if not stamp:
        return "-"
    return parse_time(stamp).strftime("%Y-%m-%d %H:%M:%S")


def parse_time(stamp: str) -> datetime:
    moment = datetime.fromisoformat(stamp)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def ago(stamp: str | None, now: datetime) -> str:
    """How long before ``now``: ``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``; ``never``."""
    if not stamp:
        return "never"
    seconds = max(0, int((now - parse_time(stamp)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def step_line(message: dict[str, Any], max_steps: int | None = None) -> str | None:
    """One plain line per stream message worth one (a step, a notable event, a status change),
    else None. The final status is left out: the caller prints the job record, with its error."""
    kind = message.get("type")
    if kind == "metrics":
        step = f"{message['step']}/{max_steps}" if max_steps else str(message["step"])
        shown = message["values"]
        if EVAL_MARK in shown and "reward" not in shown:  # step 0: the evaluation before training
            return f"step {step:>9}  {_eval_summary(shown)}"
        values = "  ".join(f"{label} {num(shown.get(key))}" for key, label in STEP_LINE_METRICS)
        return f"step {step:>9}  {values}" + (f"  {_eval_summary(shown)}" if EVAL_MARK in shown else "")
    event = message.get("event") or {}
    if kind == "event" and event.get("type") in NOTABLE_EVENTS:
        return f"[{event['type']}] {event.get('message', '')}"
    if kind == "status" and message.get("status") not in TERMINAL_STATUSES:
        return f"status: {message.get('status')}"
    return None


@dataclass
class WatchView:
    """What ``grpo watch`` shows of a job, fed one stream message at a time (:meth:`update`)
    and drawn by :meth:`lines`."""

    job_id: int
    name: str = ""
    status: str = "?"
    max_steps: int | None = None
    step: int = 0
    # The newest step in the series (a reconnect must not append one twice); -1: none yet, so
    # step 0's evaluation before training is taken too.
    metric_step: int = -1
    history: int = 120  # values kept per series; the sparkline shows what fits the width
    series: dict[str, deque] = field(default_factory=dict)
    evals: deque = field(init=False)  # eval_reward of each eval point
    note: str = ""  # the latest notable event

    def __post_init__(self) -> None:
        self.evals = deque(maxlen=self.history)

    @classmethod
    def of(cls, job: dict[str, Any], history: int = 120) -> WatchView:
        view = cls(job_id=job["id"], history=history)
        view.take_job(job)
        return view

    def take_job(self, job: dict[str, Any]) -> None:
        self.name, self.status = job.get("name", self.name), job.get("status", self.status)
        self.max_steps = job.get("max_steps") or self.max_steps
        self.step = max(self.step, job.get("last_step") or 0)

    def update(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "metrics" and message["step"] > self.metric_step:
            self.step = max(self.step, message["step"])
            self.metric_step = message["step"]
            values = message["values"]
            if EVAL_MARK in values:
                self.evals.append(values[EVAL_MARK])
            if message["step"] == 0 and EVAL_MARK in values:
                return  # the evaluation before training: no training step to draw
            for key, _ in WATCH_SERIES:
                self.series.setdefault(key, deque(maxlen=self.history)).append(values.get(key))
        elif kind == "status":
            self.status = message.get("status", self.status)
            if message.get("job"):
                self.take_job(message["job"])
        elif kind == "event" and (message.get("event") or {}).get("type") in NOTABLE_EVENTS:
            event = message["event"]
            self.note = f"[{event['type']}] {event.get('message', '')}"

    def lines(self, width: int = 80) -> list[str]:
        """The frame, each line at most ``width - 1`` characters (a full line would wrap in some
        terminals and break the repaint)."""
        width = max(width - 1, 20)
        out = [f"job {self.job_id} {self.name} · {self.status}", progress(self.step, self.max_steps,
                                                                            min(40, max(10, width - 24)))]
        rows = [(label, list(self.series.get(key, ()))) for key, label in WATCH_SERIES]
        if self.evals:
            rows.append((WATCH_EVAL_LABEL, list(self.evals)))
        label_width = max(len(label) for label, _ in rows)
        out += [_series_line(label, values, label_width, width) for label, values in rows]
        if self.note:
            out.append(self.note)
        return [clip(line.rstrip(), width) for line in out]


def _series_line(label: str, values: list[Any], label_width: int, width: int) -> str:
    """``label  latest  sparkline  low..high`` (the range only where it fits and the series moves)."""
    latest = values[-1] if values else None
    present = [v for v in map(finite, values) if v is not None]
    low, high = (min(present), max(present)) if present else (0.0, 0.0)
    span = f"  {num(low)}..{num(high)}" if low < high else ""
    head = f"{label:<{label_width}}  {num(latest):>9}  "
    room = width - len(head)
    if room - len(span) < min(len(values), 10):  # a narrow terminal: the sparkline first
        span = ""
    return head + sparkline(values, max(0, room - len(span))) + span


def repaint(previous_lines: int, lines: Sequence[str]) -> str:
    """ANSI text that replaces the ``previous_lines`` lines last drawn above the cursor with
    ``lines``: cursor up, to column 1, clear to the end of the screen, draw."""
    back = f"\x1b[{previous_lines}A\r\x1b[J" if previous_lines else ""
    return back + "".join(f"{line}\n" for line in lines)


# ---- One function per command's text view: the API's JSON in, lines out ----


def status_text(job: dict[str, Any]) -> str:
    """The job's status as the service labels it for people (``succeeded with warnings`` for a
    success whose rewards left rows unscored); a server from before the label: its status."""
    return job.get("status_label") or job["status"]


def _unscored(job: dict[str, Any]) -> str | None:
    rows = job.get("unscored_rows")
    return f"{rows} row(s) the rewards could not score (`grpo events` says why)" if rows else None


def _alerts(job: dict[str, Any]) -> str | None:
    alerts = job.get("alerts") or []  # a server from before alerts has none
    shown = ", ".join(f"{alert['rule']} ({alert['action']}, step {alert['step']})" for alert in alerts)
    return f"{shown} (`grpo alerts {job['id']}` says more)" if alerts else None


def _best(job: dict[str, Any]) -> str | None:
    best = job.get("best")
    return f"step {best['step']}: {best['metric']} {num(best['value'])}" if best else None


def alerts_table(events: Sequence[dict[str, Any]], width: int | None = None) -> list[str]:
    """``grpo alerts``: each trip of a health rule (its ``alert`` events), then what each rule shown
    watches."""
    rows = [_alert_row(event["data"], event) for event in events]
    lines = table(["STEP", "TIME", "RULE", "ACTION", "VALUE", "MESSAGE"], rows, width)
    rules = dict.fromkeys(event["data"].get("rule") for event in events)
    explained = [clip(f"{rule}: {ALERT_RULES[rule]}", width) for rule in rules if rule in ALERT_RULES]
    return [*lines, "", *explained]


def _alert_row(data: dict[str, Any], event: dict[str, Any]) -> list[Any]:
    return [data.get("step"), when(event["ts"]), data.get("rule"), data.get("action"), num(data.get("value")),
            event["message"]]


def final_line(job: dict[str, Any]) -> str:
    error = job.get("error")
    suffix = f" [{error['code']}] {error['message']}" if error else ""
    return f"job {job['id']} {status_text(job)} at step {job['last_step']}{suffix}"


def _waits(job: dict[str, Any]) -> str | None:
    position, reason = job.get("queue_position"), job.get("pending_reason")
    if position is None:
        return reason
    return f"#{position} {reason or ''}".rstrip()


def _explained(text: str | None, explanation: str | None) -> str | None:
    return f"{text}: {explanation}" if text and explanation else text


def pending_legend(reasons: Sequence[str | None], width: int | None = None) -> list[str]:
    """One line per distinct pending reason shown in a table, saying what it means."""
    known = [(reason, text) for reason in dict.fromkeys(reasons) if (text := pending_reason_text(reason))]
    return [clip(f"{reason}: {text}", width) for reason, text in known]


def jobs_table(jobs: Sequence[dict[str, Any]], width: int | None = None) -> list[str]:
    # A job by epochs over a file dataset has no step count until its worker counted the prompts.
    rows = [[job["id"], job["name"], job["status"], f"{job['last_step']}/{job['max_steps'] or '?'}",
             job["pool"], job["gpus"], job["priority"], when(job["created_at"]), _waits(job),
             # last: the widest, and the first cut on a narrow terminal; a server from before tags has none
             ",".join(job.get("tags") or []) or "-"] for job in jobs]
    headers = ["ID", "NAME", "STATUS", "STEP", "POOL", "GPUS", "PRIORITY", "CREATED", "WAITS", "TAGS"]
    return table(headers, rows, width)


def job_details(job: dict[str, Any], width: int | None = None, team: str | None = None) -> list[str]:
    """``grpo show``: one ``field  value`` line per thing known about the job (``team``: its name)."""
    where = f"attempt {job['attempt']}" + _hosts(job)
    error = job.get("error")
    fields = [
        ("status", f"{status_text(job)} ({where})"),
        ("progress", progress(job["last_step"], job["max_steps"], 30)),
        ("placement", f"pool {job['pool']}, {job['gpus']} GPU(s), priority {job['priority']}"),
        ("team", f"{team} (id {job['team_id']})" if team else job["team_id"]),
        ("waits", _explained(_waits(job), pending_reason_text(job.get("pending_reason")))),
        ("cancel", "requested" if job.get("cancel_requested") else None),
        ("preempt", "requested" if job.get("preempt_requested") else None),
        *((name, when(job.get(f"{name}_at")) if job.get(f"{name}_at") else None)
          for name in ("created", "dispatched", "started", "finished", "heartbeat")),
        ("checkpoint", job.get("latest_checkpoint")),
        ("unscored", _unscored(job)),
        ("alerts", _alerts(job)),
        ("best", _best(job)),
        ("error", f"[{error['code']}] {error['message']}" if error else None),
        ("meaning", error_code_text(error["code"]) if error else None),
    ]
    lines = [f"job {job['id']}  {job['name']}"]
    lines += [f"{name:<11} {value}" for name, value in fields if value is not None]
    return [clip(line, width) for line in lines]


def placement_text(placement: Sequence[dict[str, Any]]) -> str:
    """``w1 [0,1] + w2 [0]``: every worker a job holds devices on, node-rank order (a worker alone
    when its devices were not recorded: all of them)."""
    return " + ".join(host["worker"] if host["devices"] is None
                      else f"{host['worker']} [{','.join(map(str, host['devices']))}]" for host in placement)


def _hosts(job: dict[str, Any]) -> str:
    """``, worker w1 [0]`` or, for a job spanning hosts, ``, workers w1 [0,1] + w2 [0]``; a server from
    before placements names its one worker."""
    placement = job.get("placement") or []
    if placement:
        return f", {'workers' if len(placement) > 1 else 'worker'} {placement_text(placement)}"
    return f", worker {job['worker_id']}" if job.get("worker_id") else ""


def events_table(events: Sequence[dict[str, Any]], width: int | None = None) -> list[str]:
    rows = [[event["id"], when(event["ts"]), event["level"], event["type"], event["message"]]
            for event in events]
    return table(["ID", "TIME", "LEVEL", "TYPE", "MESSAGE"], rows, width)


def metric_names(records: Sequence[dict[str, Any]]) -> list[str]:
    """Every metric any record has, ``step`` aside, sorted: a stable column order."""
    return sorted({name for record in records for name in record["values"]} - {"step"})


def _eval_summary(values: dict[str, Any]) -> str:
    return "  ".join(f"{name} {num(values.get(name))}" for name in EVAL_SUMMARY)


def eval_points(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the steps that evaluated (step 0's evaluation before training among them)."""
    return [record for record in records if EVAL_MARK in record["values"]]


def eval_metric_names(records: Sequence[dict[str, Any]]) -> list[str]:
    """The eval columns the records have: :data:`EVAL_TABLE_METRICS`, then each reward function's
    eval mean."""
    found = set(metric_names(records))
    return ([name for name in EVAL_TABLE_METRICS if name in found]
            + sorted(name for name in found if EVAL_REWARD_FN.match(name)))


def metrics_table(records: Sequence[dict[str, Any]], names: Sequence[str] | None = None,
                  width: int | None = None) -> list[str]:
    """Steps down, metrics across: ``names``, else those of :data:`TABLE_METRICS` the job has and,
    when it evaluates, :data:`EVAL_SUMMARY` (else all it has)."""
    if not names:
        found = set(metric_names(records))
        names = [name for name in (*TABLE_METRICS, *EVAL_SUMMARY) if name in found] or sorted(found)
    rows = [[record["step"], *(record["values"].get(name) for name in names)] for record in records]
    return table(["STEP", *names], rows, width)
