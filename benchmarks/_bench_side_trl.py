"""``core_vs_trl.py --side trl``: TRL's ``GRPOTrainer`` run, in its own child process.

Same model, prompts, reward and hyper-parameters as our core's side; TRL's phases are timed in a
thin subclass and the per-step measurements are returned as a dict.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from typing import Any

from _bench_sides import Clock, StepGate, attach_clocks, say_yes_reward, workload_prompts
from _common import ForeignCpu, current_rss_mb, peak_rss_mb, ru_maxrss_mb


def side_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    phase_totals: dict[str, float] = {"generation": 0.0, "reward": 0.0, "ref": 0.0, "prepare": 0.0}

    def timed(name: str, method: Any, only_without_grad: bool = False) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            counted = not only_without_grad or not torch.is_grad_enabled()
            t0 = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                if counted:
                    phase_totals[name] += time.perf_counter() - t0

        return wrapper

    class TimedGRPOTrainer(trl.GRPOTrainer):
        """TRL's trainer with its phases timed; behaviour unchanged."""

        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self._generate_single_turn = timed("generation", self._generate_single_turn)
            self._calculate_rewards = timed("reward", self._calculate_rewards)
            # No-grad log-prob passes are the reference model's here (num_iterations=1, no old logps).
            self._get_per_token_logps_and_entropies = timed(
                "ref", self._get_per_token_logps_and_entropies, only_without_grad=True
            )
            self._generate_and_score_completions = timed("prepare", self._generate_and_score_completions)

    gate = StepGate(args.sync_fds)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.waits: list[float] = []
            self.step_times: list[float] = []
            self.step_ends: list[float] = []
            self.peak_mb: list[float] = []
            self.foreign: list[float] = []
            self.monitor = ForeignCpu()
            self.rewards: dict[int, float] = {}
            self.lengths: dict[int, float] = {}
            self.kl: dict[int, float] = {}
            self.phases: dict[str, list[float]] = {name: [] for name in phase_totals}
            self.phases |= {"model_forward": [], "backward": []}
            self.clocks: tuple[Clock, Clock] | None = None

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.waits.append(gate.wait())
            if self.clocks is not None:
                self.clocks[0].take()
                self.clocks[1].take()
            self.monitor.restart()
            self.begin = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            now = time.perf_counter()
            self.foreign.append(self.monitor.seconds())
            self.step_times.append(now - self.begin)
            self.step_ends.append(now)
            self.peak_mb.append(peak_rss_mb())
            for name in phase_totals:
                self.phases[name].append(phase_totals[name])
                phase_totals[name] = 0.0
            if self.clocks is not None:
                self.phases["model_forward"].append(self.clocks[0].take())
                self.phases["backward"].append(self.clocks[1].take())
            gate.done()

        def on_log(
            self, _args: Any, state: Any, _control: Any, logs: dict[str, float] | None = None, **k: Any
        ) -> None:
            if logs and "reward" in logs:
                self.rewards[state.global_step] = logs["reward"]
                self.lengths[state.global_step] = logs.get("completions/mean_length", math.nan)
                self.kl[state.global_step] = logs.get("kl", math.nan)

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    tokenizer.padding_side = "left"
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        config = trl.GRPOConfig(
            output_dir=tmp,
            # TRL's batch size counts completions: B prompts x G.
            per_device_train_batch_size=args.prompts_per_step * args.num_generations,
            num_generations=args.num_generations,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            max_completion_length=args.max_completion_length,
            temperature=1.0,
            beta=args.beta,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            loss_type="dapo",
            epsilon=0.2,
            epsilon_high=0.28,
            max_grad_norm=1.0,
            scale_rewards="group",
            num_iterations=1,
            max_steps=args.warmup + args.steps,
            seed=args.seed,
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,  # both default to True; both sides turn it off
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            disable_dropout=True,
            log_completions=False,
            use_vllm=False,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        timer = StepTimer()
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=say_yes_reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": workload_prompts(args.preset)}),
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.remove_callback(PrinterCallback)  # symmetric with our side, which prints nothing
        timer.clocks = attach_clocks([m for m in (trainer.model, trainer.ref_model) if m is not None])
        checkpointing = bool(getattr(trainer.model, "is_activation_checkpointing", False))
        load_s = time.perf_counter() - started
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        train_started = time.perf_counter()
        trainer.train()
        if args.profile:
            profiler.disable()
            profiler.dump_stats(args.profile)
    gate.wait()  # final barrier
    steps = range(1, len(timer.step_times) + 1)
    ends = [train_started, *timer.step_ends]
    return {
        "side": "trl",
        "load_s": load_s,
        "step_times": timer.step_times,
        "intervals": [b - a - w for a, b, w in zip(ends, ends[1:], timer.waits, strict=False)],
        "rewards": [timer.rewards.get(s, math.nan) for s in steps],
        "completion_length": [timer.lengths.get(s, math.nan) for s in steps],
        "kl": [timer.kl.get(s, math.nan) for s in steps],
        "phases": timer.phases,
        "foreign_cpu_s": timer.foreign,
        "peak_rss_mb": timer.peak_mb[-1],
        "peak_rss_mb_exit": peak_rss_mb(),
        "ru_maxrss_mb_exit": ru_maxrss_mb(),
        "rss_mb_exit": current_rss_mb(),
        "optimizer": config.optim,
        "activation_checkpointing": checkpointing,
        "threads": torch.get_num_threads(),
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
