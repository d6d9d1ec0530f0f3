"""What a team uses. ``grpo usage [--days N | --since ISO] [--until ISO]``: GPU-hours each team
used per pool over a window (``GET /v1/usage``; default: the last 7 days); a member's key shows its
own team, an admin's every team. ``grpo me``: who the key is, and the storage its team holds
against its artifact quota, jobs' artifacts and uploaded files apart (``GET /v1/me``). Exit codes
and ``--json`` as the other client commands (``api.cli.calling``).
"""

from __future__ import annotations

import argparse
from typing import Any

from api.cli.calling import Result, call_api

USAGE_COMMAND, ME_COMMAND = "usage", "me"


def usage_lines(view: dict[str, Any]) -> list[str]:
    """A line naming the window, then one row per team and pool."""
    from api.cli.term_view import table, when

    heading = f"GPU use from {when(view['since'])} to {when(view['until'])} UTC"
    if not view["items"]:
        return [heading, "no GPU use in this window"]
    rows = [[item["team"], item["pool"], round(item["gpu_hours"], 2), round(item["gpu_seconds"])]
            for item in view["items"]]
    return [heading, *table(["TEAM", "POOL", "GPU-HOURS", "GPU-SECONDS"], rows)]


def me_lines(me: dict[str, Any]) -> list[str]:
    """The key and team, then the bytes the quota counts and what they are."""
    key = "the operator token" if me["key_prefix"] is None else f"key {me['key_prefix']}…"
    quota = me["artifact_quota_bytes"]
    share = 0 if quota is None else 100 * me["artifact_bytes"] / max(quota, 1)
    limit = "no quota" if quota is None else f"quota {quota:,} bytes ({share:.1f}% used)"
    return [f"team {me['team']} (id {me['team_id']}), {key}{', admin' if me['is_admin'] else ''}",
            f"storage: {me['artifact_bytes']:,} bytes, {limit}",
            f"  job artifacts:  {me['job_artifact_bytes']:,} bytes (grpo rm ID frees a finished job's)",
            f"  uploaded files: {me['file_bytes']:,} bytes (grpo files rm ID frees one)"]


def _me(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        me = client.me()
        return Result(me, "\n".join(me_lines(me)))

    return call_api(args.api_url, args.api_key, args.json, command)


def _usage(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        view = client.usage(args.since, args.until, args.days)
        return Result(view, "\n".join(usage_lines(view)))

    return call_api(args.api_url, args.api_key, args.json, command)


def add_usage_commands(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    usage = commands.add_parser(USAGE_COMMAND, parents=[common_options()],
                                help="GPU-hours each team used per pool (default: the last 7 days)")
    start = usage.add_mutually_exclusive_group()
    start.add_argument("--days", type=int, default=None, metavar="N", help="the last N days before --until")
    start.add_argument("--since", default=None, metavar="ISO", help="window start (ISO 8601; no offset: UTC)")
    usage.add_argument("--until", default=None, metavar="ISO", help="window end, excluded (default: now)")
    usage.set_defaults(handler=_usage)
    commands.add_parser(ME_COMMAND, parents=[common_options()],
                        help="the key's team and the storage it holds against its artifact quota"
                        ).set_defaults(handler=_me)
