"""``core_vs_trl.py --side core``: our GRPO core's run, in its own child process.

Builds the job spec from the shared workload, checks that the registry rewards match
:func:`_bench_sides.plain_reward`, trains, and returns the per-step measurements as a dict.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench_sides import (
    CORE_REWARDS,
    REWARD_CHECK_STRINGS,
    StepGate,
    attach_clocks,
    max_prompt_tokens,
    plain_reward,
    workload_prompts,
)
from _common import ForeignCpu, current_rss_mb, peak_rss_mb, ru_maxrss_mb


def _time_lean_decoder(clock: Any) -> None:
    """Our sampling runs the model's modules through ``LeanDecoder`` rather than calling the
    model's forward, which the clock's hooks time: its prefill and steps count as forward time."""
    from grpo_core.algorithm.decoders import LeanDecoder

    for name in ("prefill", "step"):
        method = getattr(LeanDecoder, name)

        def timed(self: Any, *args: Any, _method: Any = method) -> Any:
            clock.start()
            try:
                return _method(self, *args)
            finally:
                clock.stop()

        setattr(LeanDecoder, name, timed)


def _core_spec(args: argparse.Namespace) -> Any:
    from api.domain.job_spec import JobSpec

    return JobSpec.model_validate(
        {
            "name": "bench-core-vs-trl",
            "model": {"source": f"path:{args.model_dir}", "dtype": "float32"},
            "dataset": {"prompts": [{"prompt": p} for p in workload_prompts(args.preset)]},
            "rewards": CORE_REWARDS,
            "reasoning": {"enabled": False},
            "grpo": {
                "num_generations": args.num_generations,
                "prompts_per_step": args.prompts_per_step,
                "max_prompt_length": max_prompt_tokens(args.preset),
                "max_completion_length": args.max_completion_length,
                "temperature": 1.0,
                "beta": args.beta,
                "epsilon": 0.2,
                "epsilon_high": 0.28,
                "loss_type": "dapo",
                "learning_rate": args.learning_rate,
                "lr_scheduler_type": "constant",
                "max_grad_norm": 1.0,
                "max_steps": args.warmup + args.steps,
                "seed": args.seed,
                "gradient_checkpointing": False,  # as the TRL side's activation_checkpointing
            },
            "checkpoint_every": 10_000_000,
            "log_completions_every": 10_000_000,
        }
    )


def _check_core_rewards(components: Any) -> float:
    """Max |ours - plain| over :data:`REWARD_CHECK_STRINGS`; raises if they differ."""
    import torch

    from grpo_core.algorithm.advantages import combine_rewards
    from grpo_core.algorithm.completion_text import split_reasoning
    from grpo_core.rewards import score_completions

    texts = REWARD_CHECK_STRINGS
    answers = [split_reasoning(t, components.spec.reasoning).answer for t in texts]
    prompts = ["p"] * len(texts)
    matrix = score_completions(components.rewards, answers, prompts, {}, raw_completions=list(texts)).matrix
    weights = torch.tensor([r.weight for r in components.rewards], dtype=torch.float32)
    ours = combine_rewards(torch.tensor(matrix, dtype=torch.float32), weights).tolist()
    diff = max(abs(a - plain_reward(t)) for a, t in zip(ours, texts, strict=True))
    if diff > 1e-6:
        raise AssertionError(f"registry rewards differ from plain_reward by {diff}")
    return diff


def side_core(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from grpo_core.run.callbacks import TrainerCallback
    from grpo_core.run.components import build_components
    from grpo_core.run.trainer import GRPOTrainer

    started = time.perf_counter()
    components = build_components(_core_spec(args), device="cpu")
    load_s = time.perf_counter() - started
    check_diff = _check_core_rewards(components)

    models = [components.models.policy]
    if components.models.reference is not None:
        models.append(components.models.reference)
    forward_clock, backward_clock = attach_clocks(models)
    _time_lean_decoder(forward_clock)

    gate = StepGate(args.sync_fds)

    class Recorder(TrainerCallback):
        def __init__(self) -> None:
            self.waits: list[float] = []
            self.model_forward: list[float] = []
            self.backward: list[float] = []
            self.records: list[dict[str, Any]] = []
            self.step_ends: list[float] = []
            self.peak_mb: list[float] = []
            self.foreign: list[float] = []
            self.monitor = ForeignCpu()
            self.sample_diff: float | None = None

        def on_step(self, record: dict[str, Any]) -> None:
            self.step_ends.append(time.perf_counter())
            self.foreign.append(self.monitor.seconds())
            self.peak_mb.append(peak_rss_mb())
            self.records.append(record)
            self.model_forward.append(forward_clock.take())
            self.backward.append(backward_clock.take())
            gate.done()
            self.monitor.restart()

        def should_stop(self) -> bool:
            # Asked before every step (the lock-step gate, a no-op when run alone) and, in a long
            # generation, inside it too: the gate is passed once, before each step.
            if len(self.waits) == len(self.records):
                self.waits.append(gate.wait())
                self.monitor.restart()
            return False

        def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
            # Real completions of step 1: the reward the core gave vs plain_reward on the raw text.
            self.sample_diff = max(abs(r["reward"] - plain_reward(r["completion"])) for r in rows)

    recorder = Recorder()
    with tempfile.TemporaryDirectory(prefix="bench-core-") as tmp:
        trainer = GRPOTrainer(components, Path(tmp) / "checkpoints", recorder)
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        train_started = time.perf_counter()
        recorder.monitor.restart()
        forward_clock.take()
        backward_clock.take()
        trainer.train()
        if args.profile:
            profiler.disable()
            profiler.dump_stats(args.profile)
    gate.wait()  # final barrier: the end-of-training checkpoint is written before the other side goes on
    recs = recorder.records
    if recorder.sample_diff is not None and recorder.sample_diff > 1e-5:
        diff = recorder.sample_diff
        raise AssertionError(f"step-1 completions: core reward differs from plain_reward by {diff}")
    ends = [train_started, *recorder.step_ends]
    names = ("generation", "reward", "ref", "update")
    phases = {name: [r.get(f"timing/{name}") or 0.0 for r in recs] for name in names}
    phases |= {"model_forward": recorder.model_forward, "backward": recorder.backward}
    return {
        "side": "core",
        "load_s": load_s,
        "step_times": [r["step_time"] for r in recs],
        "intervals": [b - a - w for a, b, w in zip(ends, ends[1:], recorder.waits, strict=False)],
        "rewards": [r["reward"] for r in recs],
        "completion_length": [r["completions/mean_length"] for r in recs],
        "kl": [r.get("kl") for r in recs],
        "phases": phases,
        "foreign_cpu_s": recorder.foreign,
        "peak_rss_mb": recorder.peak_mb[-1],
        "peak_rss_mb_exit": peak_rss_mb(),
        "ru_maxrss_mb_exit": ru_maxrss_mb(),
        "rss_mb_exit": current_rss_mb(),
        "reward_check_max_diff": check_diff,
        "reward_check_step1_max_diff": recorder.sample_diff,
        "threads": torch.get_num_threads(),
    }
