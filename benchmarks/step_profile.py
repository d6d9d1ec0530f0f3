"""Where one GRPO step of our core spends its CPU, by operator: ``torch.profiler`` over one step.

The same job as ``core_vs_trl.py``'s core side (same presets, model and data), trained for
``--warmup`` steps unprofiled and then one step under the profiler, whose table (by self CPU
time) is printed with the step's phases. Used for BENCHMARKS.md's "What bounds the long-prompt
step".

Run: ``.venv/bin/python benchmarks/step_profile.py --preset long-prompt [--beta 0] [--rows 30]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core_vs_trl  # noqa: E402  (after the path: it imports its siblings)
from _bench_side_core import _core_spec  # noqa: E402
from _bench_sides import side_build  # noqa: E402


def main(argv: list[str]) -> int:
    # --rows is this script's own; everything else is core_vs_trl's (preset, beta, warmup...).
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--rows", type=int, default=30, help="operators in the printed table")
    known, rest = own.parse_known_args(argv)
    rows = known.rows
    args = core_vs_trl.parse_args([*rest, "--steps", "1"])
    import torch

    from grpo_core.run.callbacks import TrainerCallback
    from grpo_core.run.components import build_components
    from grpo_core.run.trainer import GRPOTrainer

    torch.set_num_threads(args.threads)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

    class ProfileLastStep(TrainerCallback):
        done = 0

        def on_step(self, record: dict) -> None:
            self.done += 1
            phases = {name.removeprefix("timing/"): round(value, 3) for name, value in record.items()
                      if name.startswith("timing/")}
            print(f"step {self.done}: {record['step_time']:.3f} s {phases}", flush=True)
            if self.done == args.warmup:
                profiler.start()
            elif self.done == args.warmup + 1:
                profiler.stop()

    with tempfile.TemporaryDirectory(prefix="step-profile-") as tmp:
        args.model_dir = str(Path(tmp) / "model")
        side_build(args)
        components = build_components(_core_spec(args), device="cpu")
        if args.warmup == 0:
            profiler.start()
        GRPOTrainer(components, Path(tmp) / "checkpoints", ProfileLastStep()).train()
    averages = profiler.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
