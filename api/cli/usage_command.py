"""What a team uses. ``grpo usage [--days N | --since ISO] [--until ISO]``: GPU-hours each team
used per pool over a window (``GET /v1/usage``; default: the last 7 days), then each team's GPU-hour
budget this period and what is left of it; a member's key shows its own team, an admin's every
team. ``grpo me``: who the key is, and the storage its team holds against its artifact quota, jobs'
artifacts and uploaded files apart (``GET /v1/me``). ``grpo set-budget ID HOURS``: a job's own
GPU-hour budget (``PATCH /v1/jobs/{id}``). Exit codes and ``--json`` as the other client commands
(``api.cli.calling``).
"""

from __future__ import annotations

import argparse
from typing import Any

from api.cli.calling import Result, call_api
from api.cli.estimate_command import gpu_hours_text
from api.domain.lifecycle import Action

USAGE_COMMAND, ME_COMMAND, BUDGET_COMMAND = "usage", "me", "set-budget"
BUDGET_FIGURES = ("gpu_hours_budget", "used_gpu_hours", "left_gpu_hours")


def usage_lines(view: dict[str, Any]) -> list[str]:
    """A line naming the window, then one row per team and pool; then each team's budget."""
    from api.cli.term_view import table, when

    heading = f"GPU use from {when(view['since'])} to {when(view['until'])} UTC"
    if not view["items"]:
        lines = [heading, "no GPU use in this window"]
    else:
        rows = [[item["team"], item["pool"], round(item["gpu_hours"], 2), round(item["gpu_seconds"])]
                for item in view["items"]]
        lines = [heading, *table(["TEAM", "POOL", "GPU-HOURS", "GPU-SECONDS"], rows)]
    budgets = [[b["team"], b["period"], *(gpu_hours_text(b[key]) for key in BUDGET_FIGURES),
                when(b["period_end"])] for b in view.get("budgets", ())]
    if budgets:
        lines += ["", "GPU-hour budgets this period (UTC)",
                  *table(["TEAM", "PERIOD", "BUDGET", "USED", "LEFT", "RENEWS"], budgets)]
    return lines


def _set_budget(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        job = client.update(args.job_id, {"max_gpu_hours": args.hours})
        budget = "no budget of its own" if args.hours is None else f"a budget of {args.hours:g} GPU-hours"
        resumable = f"; `grpo resume {job['id']}` continues it" if Action.RESUME in job["actions"] else ""
        return Result(job, f"job {job['id']} ({job['status']}) has {budget}{resumable}")

    return call_api(args.api_url, args.api_key, args.json, command)


def _budget_hours(text: str) -> float | None:
    """GPU-hours above 0, or ``none`` (no budget of its own)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of GPU-hours above 0, or 'none'")
    return value


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
    budget = commands.add_parser(BUDGET_COMMAND, parents=[common_options()],
                                 help="set a job's own GPU-hour budget (raise it to resume a job it paused)")
    budget.add_argument("job_id", type=int, metavar="ID")
    budget.add_argument("hours", type=_budget_hours, metavar="HOURS",
                        help="GPU-hours (GPUs × hours held, every attempt), or 'none'")
    budget.set_defaults(handler=_set_budget)
