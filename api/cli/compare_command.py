"""``grpo compare ID ID ... [--metric NAME ...]``: jobs side by side (``GET /v1/jobs/compare``).
Per metric a table of each job's last value, lowest, highest and steps, with a sparkline of its
series on a terminal; then the spec fields whose values differ, as the server computed them
(with how many it left out to stay within its byte budget). Exit codes and ``--json`` as
the other client commands (``api.cli.calling``)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

from api.cli.calling import Result, call_api

COMPARE_COMMAND = "compare"
SPARK_WIDTH = 40


def comparison_lines(view: dict[str, Any], sparklines: bool = False, width: int | None = None) -> list[str]:
    """A table per metric, then the spec differences (or a line saying there are none)."""
    from api.cli.term_view import sparkline, table

    lines: list[str] = []
    for metric, by_job in view["metrics"].items():
        headers = ["JOB", "NAME", "LAST", "MIN", "MAX", "STEPS"] + (["SERIES"] if sparklines else [])
        rows = []
        for job in view["jobs"]:
            points = by_job.get(str(job["id"])) or []
            values = [value for _, value in points]
            row = [job["id"], job["name"], *_summary(points)]
            rows.append(row + ([sparkline(values, SPARK_WIDTH)] if sparklines else []))
        lines += [f"{metric}:", *table(headers, rows, width), ""]
    lines += _difference_lines(view, width)
    return lines


def _summary(points: list[list[float]]) -> list[float | None]:
    """Last value, lowest, highest and the last step; nothing (``-``) for a job without the metric."""
    if not points:
        return [None] * 4
    values = [value for _, value in points]
    return [values[-1], min(values), max(values), int(points[-1][0])]


def _difference_lines(view: dict[str, Any], width: int | None) -> list[str]:
    from api.cli.term_view import table

    # The server bounds the differences by bytes (GRPO_COMPARE_DIFF_BYTES) and counts what it left out.
    omitted = view.get("spec_diff_omitted") or 0
    left_out = [f"{omitted} more differing field(s) left out: the answer's byte budget"] if omitted else []
    if not view["spec_diff"]:
        return left_out or ["the specs do not differ"]
    ids = [str(job["id"]) for job in view["jobs"]]
    rows = [[row["field"], *(_shown(row["values"].get(job_id)) for job_id in ids)]
            for row in view["spec_diff"]]
    headers = ["FIELD", *(f"JOB {job_id}" for job_id in ids)]
    return ["spec differences:", *table(headers, rows, width), *left_out]


def _shown(value: Any) -> str:
    """A spec value as the spec would write it (JSON), ``-`` where the spec lacks the field."""
    return "-" if value is None else value if isinstance(value, str) else json.dumps(value)


def _compare(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        view = client.compare(args.job_ids, args.metric or ())
        # Sparklines and cut lines on a terminal only: piped output stays whole and plain.
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        return Result(view, "\n".join(comparison_lines(view, sparklines=width is not None, width=width)))

    return call_api(args.api_url, args.api_key, args.json, command)


def add_compare_command(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    compare = commands.add_parser(COMPARE_COMMAND, parents=[common_options()],
                                  help="jobs side by side: their metrics and where their specs differ")
    compare.add_argument("job_ids", type=int, nargs="+", metavar="ID", help="2 to 10 job ids")
    compare.add_argument("--metric", action="append", metavar="NAME",
                         help="a metric to compare (repeat for more; default: reward)")
    compare.set_defaults(handler=_compare)
