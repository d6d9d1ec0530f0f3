"""``grpo usage [--days N | --since ISO] [--until ISO]``: GPU-hours each team used per pool over a
window (``GET /v1/usage``; default: the last 7 days). A member's key shows its own team, an
admin's every team. Exit codes and ``--json`` as the other client commands (``api.cli.calling``).
"""

from __future__ import annotations

import argparse
from typing import Any

from api.cli.calling import Result, call_api

USAGE_COMMAND = "usage"


def usage_lines(view: dict[str, Any]) -> list[str]:
    """A line naming the window, then one row per team and pool."""
    from api.cli.term_view import table, when

    heading = f"GPU use from {when(view['since'])} to {when(view['until'])} UTC"
    if not view["items"]:
        return [heading, "no GPU use in this window"]
    rows = [[item["team"], item["pool"], round(item["gpu_hours"], 2), round(item["gpu_seconds"])]
            for item in view["items"]]
    return [heading, *table(["TEAM", "POOL", "GPU-HOURS", "GPU-SECONDS"], rows)]


def _usage(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        view = client.usage(args.since, args.until, args.days)
        return Result(view, "\n".join(usage_lines(view)))

    return call_api(args.api_url, args.api_key, args.json, command)


def add_usage_command(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    usage = commands.add_parser(USAGE_COMMAND, parents=[common_options()],
                                help="GPU-hours each team used per pool (default: the last 7 days)")
    start = usage.add_mutually_exclusive_group()
    start.add_argument("--days", type=int, default=None, metavar="N", help="the last N days before --until")
    start.add_argument("--since", default=None, metavar="ISO", help="window start (ISO 8601; no offset: UTC)")
    usage.add_argument("--until", default=None, metavar="ISO", help="window end, excluded (default: now)")
    usage.set_defaults(handler=_usage)
