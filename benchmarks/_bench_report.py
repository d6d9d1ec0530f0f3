"""Parent side of ``core_vs_trl.py``: pool the children's step records, compare, render.

Summaries per side (medians, quiet steps, final reward and its standard error, per-phase
breakdown), the PASS/FAIL verdict against the targets, and the plain-text report.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from _bench_sides import REWARD_CHECK_STRINGS
from _common import format_table, median

LAST_N = 5
SPEED_TARGET = 1.3

# A step is "quiet" when other processes used less than this fraction of one core during it.
QUIET_FRACTION = 0.10


def _is_quiet(run: dict[str, Any], i: int) -> bool:
    return run["foreign_cpu_s"][i] < QUIET_FRACTION * run["step_times"][i]


def _measured_indices(run: dict[str, Any], warmup: int, quiet_only: bool) -> list[int]:
    return [i for i in range(warmup, len(run["step_times"])) if not quiet_only or _is_quiet(run, i)]


def phase_row(runs: list[dict[str, Any]], warmup: int, quiet_only: bool) -> list[float]:
    """Medians of generation, reward, reference log-probs, other preparation, update, whole step.

    Ours: ``timing/update`` is the update; other prep = step - (generation + reward + ref + update)
    (prompt tokenizing, decoding, advantages, bookkeeping). TRL: the update is step -
    ``_generate_and_score_completions``; other prep = that method - (generation + reward + ref).
    Then, across phases: time inside the models' forward calls, inside ``Tensor.backward``, and
    the rest of the step.
    """
    rows = []
    for run in runs:
        ph = run["phases"]
        for i in _measured_indices(run, warmup, quiet_only):
            step = run["step_times"][i]
            gen, rew, ref = ph["generation"][i], ph["reward"][i], ph["ref"][i]
            if "update" in ph:
                update = ph["update"][i]
                other = step - gen - rew - ref - update
            else:
                update = step - ph["prepare"][i]
                other = ph["prepare"][i] - gen - rew - ref
            fwd, bwd = ph["model_forward"][i], ph["backward"][i]
            rows.append((gen, rew, ref, other, update, step, fwd, bwd, step - fwd - bwd))
    return [median([r[k] for r in rows]) for k in range(9)]


def summarise(runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Pool the measured steps of every run of one side."""
    steps = [run["step_times"][i] for run in runs for i in _measured_indices(run, warmup, False)]
    quiet = [run["step_times"][i] for run in runs for i in _measured_indices(run, warmup, True)]
    intervals = [run["intervals"][i] for run in runs for i in _measured_indices(run, warmup, False)]
    # Runs with the same seed usually repeat the same curve exactly (CPU kernels are deterministic):
    # count each distinct curve once, or the standard error would shrink with repeats for nothing.
    distinct = list({tuple(run["rewards"]): None for run in runs})
    tails = [[v for v in curve[-LAST_N:] if v == v] for curve in distinct]
    pooled = [v for tail in tails for v in tail]
    final = statistics.fmean(statistics.fmean(t) for t in tails if t) if pooled else math.nan
    se = statistics.stdev(pooled) / math.sqrt(len(pooled)) if len(pooled) > 1 else 0.0
    step, quiet_step = median(steps), median(quiet)
    enough_quiet = len(quiet) >= max(5, len(steps) // 4)
    return {
        "runs": len(runs),
        "measured_steps": len(steps),
        "quiet_steps": len(quiet),
        "median_step_s": step,
        "steps_per_s": 1.0 / step,
        "quiet_median_step_s": quiet_step,
        "quiet_steps_per_s": 1.0 / quiet_step if quiet else math.nan,
        "enough_quiet": enough_quiet,
        "median_interval_s": median(intervals),
        "min_step_s": min(steps),
        "max_step_s": max(steps),
        "final_reward": final,
        "final_reward_se": se,
        "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
        "phases_quiet": phase_row(runs, warmup, True) if quiet else [math.nan] * 9,
        "phases_all": phase_row(runs, warmup, False),
    }


def paired_ratio(raw: dict[str, list[dict[str, Any]]], warmup: int) -> float:
    """Median over step pairs of TRL's step time / ours (step k of run r on both sides).

    Meaningful in lock-step, where the two steps of a pair ran back to back."""
    ratios = [
        trl_run["step_times"][i] / core_run["step_times"][i]
        for trl_run, core_run in zip(raw["trl"], raw["core"], strict=True)
        for i in range(warmup, min(len(trl_run["step_times"]), len(core_run["step_times"])))
    ]
    return median(ratios)


def compare(
    core: dict[str, Any],
    trl_: dict[str, Any],
    paired: float,
    speed_target: float = SPEED_TARGET,
    memory_target: float = 1.0,
) -> dict[str, Any]:
    use_quiet = core["enough_quiet"] and trl_["enough_quiet"]
    key = "quiet_steps_per_s" if use_quiet else "steps_per_s"
    speed = core[key] / trl_[key]
    tol = 2.0 * math.sqrt(core["final_reward_se"] ** 2 + trl_["final_reward_se"] ** 2)
    return {
        "speed_basis": "quiet steps" if use_quiet else "all measured steps",
        "speed_ratio": speed,
        "speed_ratio_all_steps": core["steps_per_s"] / trl_["steps_per_s"],
        "speed_ratio_paired": paired,
        "interval_speed_ratio": trl_["median_interval_s"] / core["median_interval_s"],
        "speed_target": speed_target,
        "speed_pass": speed >= speed_target,
        "reward_tolerance": tol,
        "reward_diff": core["final_reward"] - trl_["final_reward"],
        "reward_pass": core["final_reward"] >= trl_["final_reward"] - tol,
        "memory_ratio": core["peak_rss_mb"] / trl_["peak_rss_mb"],
        "memory_target": memory_target,
        "memory_pass": core["peak_rss_mb"] <= memory_target * trl_["peak_rss_mb"],
    }


def _curve(values: list[float]) -> str:
    return " ".join("  nan" if v != v else f"{v:5.2f}" for v in values)


def _ratio_text(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}x"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(
    args: argparse.Namespace,
    build: dict[str, Any],
    raw: dict[str, list[dict[str, Any]]],
    summary: dict[str, dict[str, Any]],
    verdict: dict[str, Any],
) -> str:
    core, trl_ = summary["core"], summary["trl"]
    trl_run, core_run = raw["trl"][0], raw["core"][0]
    n = args.prompts_per_step * args.num_generations
    phases = "phases_quiet" if verdict["speed_basis"] == "quiet steps" else "phases_all"
    lines = [
        f"Model: {args.family}, hidden {args.hidden_size}, {args.num_layers} layers, {args.num_heads} heads, "
        f"vocab {build['vocab_size']}, {build['parameters']:,} parameters "
        f"(fp32, CPU, {args.threads} threads)",
        f"GRPO: B={args.prompts_per_step} prompts x G={args.num_generations} = {n} completions/step, "
        f"max_completion_length={args.max_completion_length}, beta={args.beta}, lr={args.learning_rate}, "
        f"dapo, eps 0.2/0.28, seed {args.seed}",
        f"Steps: {args.warmup} warm-up (excluded) + {args.steps} measured per run, "
        f"{args.repeats} run(s) per side, schedule {args.schedule}; TRL {trl_run['versions']['trl']} "
        f"(optimizer {trl_run['optimizer']}), "
        f"transformers {trl_run['versions']['transformers']}, torch {trl_run['versions']['torch']}",
        f"Reward check: registry vs plain function, max |diff| = {core_run['reward_check_max_diff']:.2g} "
        f"on {len(REWARD_CHECK_STRINGS)} fixed strings, {core_run['reward_check_step1_max_diff']:.2g} "
        "on step 1's real completions",
        "",
        format_table(
            [
                "side",
                "median step s",
                "steps/s",
                "quiet steps",
                "quiet median s",
                "quiet steps/s",
                "median interval s",
                "min/max step s",
                "peak RSS MiB",
                f"final reward (last {LAST_N})",
            ],
            [
                [
                    name,
                    s["median_step_s"],
                    s["steps_per_s"],
                    f"{s['quiet_steps']}/{s['measured_steps']}",
                    s["quiet_median_step_s"],
                    s["quiet_steps_per_s"],
                    s["median_interval_s"],
                    f"{s['min_step_s']:.3f}/{s['max_step_s']:.3f}",
                    s["peak_rss_mb"],
                    f"{s['final_reward']:.3f} ± {s['final_reward_se']:.3f}",
                ]
                for name, s in (("TRL", trl_), ("ours", core))
            ],
        ),
        f"(quiet step: other processes used < {QUIET_FRACTION:.0%} of one core during it, from /proc/stat)",
        "",
        f"Median per-step phase times, s ({'quiet' if verdict['speed_basis'] == 'quiet steps' else 'all'} "
        "measured steps; each column its own median):",
        format_table(
            [
                "side",
                "generation",
                "reward",
                "ref log-probs",
                "other prep",
                "fwd+bwd+optim",
                "step",
                "| in model fwd",
                "in backward",
                "rest",
            ],
            [["TRL", *trl_[phases]], ["ours", *core[phases]]],
        ),
        "(in model fwd: inside the HF model's forward calls (sampling, reference, policy), and on our side "
        "the lean decoder's prefill and steps, which run the model's own modules; "
        "in backward: Tensor.backward; rest: the trainer's own code, optimizer step included)",
        "",
        f"Reward per step, run 1 (mean over the step's {n} completions):",
        f"  TRL : {_curve(trl_run['rewards'])}",
        f"  ours: {_curve(core_run['rewards'])}",
    ]
    for side, label in (("trl", "TRL "), ("core", "ours")):
        for k, run in enumerate(raw[side][1:], start=2):
            if run["rewards"] != raw[side][0]["rewards"]:
                lines.append(f"  {label} run {k}: {_curve(run['rewards'])}")
    lines += [
        "",
        "Targets:",
        f"  speed  ours/TRL steps/s = {verdict['speed_ratio']:.2f}x on {verdict['speed_basis']} "
        f"(all steps {verdict['speed_ratio_all_steps']:.2f}x, median of paired step ratios "
        f"{_ratio_text(verdict['speed_ratio_paired'])}, step-end intervals "
        f"{verdict['interval_speed_ratio']:.2f}x; target >= {verdict['speed_target']}x)  "
        f"{_verdict(verdict['speed_pass'])}",
        f"  reward ours - TRL = {verdict['reward_diff']:+.3f} "
        f"(pass if >= -{verdict['reward_tolerance']:.3f}, 2 x combined s.e. of the last-{LAST_N} means)  "
        f"{_verdict(verdict['reward_pass'])}",
        f"  memory ours/TRL peak RSS = {verdict['memory_ratio']:.2f} "
        f"(target <= {verdict['memory_target']:.2f})  "
        f"{_verdict(verdict['memory_pass'])}",
    ]
    return "\n".join(lines)
