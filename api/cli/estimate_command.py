"""``grpo submit SPEC --estimate``: the submit's dry run (``POST /v1/jobs?dry_run=true``), every
check a submit makes and nothing queued, printed as the job's GPU-hours estimated, how they were
counted, and what the team has left of its budget this period. Exit codes and ``--json`` as the
other client commands (``api.cli.calling``).
"""

from __future__ import annotations

from typing import Any

from api.cli.calling import Result, call_api


def gpu_hours_text(value: float | None) -> str:
    """GPU-hours as a table cell or a sentence says them; ``none`` for no budget."""
    return "none" if value is None else f"{value:.4g}"


def estimate_lines(answer: dict[str, Any]) -> list[str]:
    """A submit's dry run (``POST /v1/jobs?dry_run=true``): the GPU-hours and how they were
    counted, then what the team has left; nothing was queued."""
    guess, spec, budget = answer["estimate"], answer["spec"], answer["team_budget"]
    pool = spec.get("resources", {}).get("pool", "default")
    if guess["gpu_hours"] is None:
        total = "unknown GPU-hours: its steps are counted once its dataset is loaded"
    else:
        total = f"about {guess['gpu_hours']:.4g} GPU-hours ({guess['steps']:,} steps)"
    if guess["basis"] == "measured":
        basis = f"measured on the pool's latest succeeded jobs ({guess['measured_jobs']})"
    else:
        basis = "assumed: no job of the pool has succeeded yet (GRPO_ESTIMATE_TOKENS_PER_GPU_SECOND)"
    left, limit = (gpu_hours_text(budget[key]) for key in ("left_gpu_hours", "gpu_hours_budget"))
    left = ("no GPU-hour budget" if budget["gpu_hours_budget"] is None
            else f"{left} of {limit} GPU-hours left this {budget['period']}")
    return [f"job {spec['name']} in pool {pool}: {total}",
            f"  {guess['tokens_per_step']:,} tokens a step ({guess['prompt_tokens']} prompt tokens + "
            f"max_completion_length, per completion)",
            f"  at {guess['tokens_per_gpu_second']:,.0f} tokens per GPU-second, plus "
            f"{guess['startup_gpu_seconds']:.1f} GPU-seconds of start-up a GPU, {basis}",
            f"team {budget['team']}: {left}",
            *(f"warning: {warning['param']}: {warning['message']}" for warning in answer["warnings"]),
            "nothing was submitted (a dry run)"]


def estimate_spec(url: str, api_key: str | None, spec: dict, as_json: bool) -> int:
    """``grpo submit SPEC --estimate``: the submit's every check and its GPU-hour estimate."""
    def command(client: Any) -> Result:
        answer = client.estimate(spec)
        return Result(answer, "\n".join(estimate_lines(answer)))

    return call_api(url, api_key, as_json, command)
