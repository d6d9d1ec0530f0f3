"""Multi-rank training (issue 10): what k data-parallel ranks cost against one process, and, with
CUDA, steps/s and peak GPU memory under ``resources.sharding: ddp`` and ``fsdp``.

What runs
    One GRPO job, the same in every run: a random-init tiny model (``grpo_core.io.tiny_models``, built
    once into a temp dir; ``--hidden-size``/``--num-layers`` make it larger), 32 prompts, the
    registry's ``contains`` ("yes") + 0.5 x ``length_target`` (12 chars) rewards, B prompts x G
    completions per step, ``--warmup`` + ``--steps`` steps, fp32 on CPU (bf16 autocast on CUDA,
    as the core does). Each run is its own fresh interpreter (``--side``), so imports and peak
    memory are per run, and it goes through the entry points ``grpo train`` uses:

    * ``one``: :func:`grpo_core.run.local_run.run_local`, one process, no process group: the
      reference every other run is compared with (printed as a ratio).
    * ``ddp`` / ``fsdp``: :func:`grpo_core.run.launch.run_data_parallel` with ``--nproc`` ranks
      (torch's elastic launcher; gloo on CPU, NCCL on CUDA) and ``resources.sharding`` set to
      the mode. Every rank samples its share of whole groups; normalisers, metrics and
      gradients cross ranks; ``fsdp`` shards parameters, gradients and optimizer state per
      decoder layer (FSDP2) and gathers the policy whole while sampling.

    CPU mode (the default without CUDA): ``one`` vs ``--nproc 2`` gloo ranks on the same cores.
    ``--threads`` is the whole run's budget: ``one`` gets all of it, each rank ``threads/nproc``,
    so the ratio is the overhead of splitting the same work over ranks on the same machine
    (collectives, every rank loading the model and drawing the batch, smaller matmuls per
    process), not a speed-up: there are no extra cores to gain.

    GPU mode (CUDA available, or ``--device cuda``): ``one`` on GPU 0, then each mode on
    ``--nproc`` GPUs (default: all visible). What ``fsdp`` on one GPU measures: FSDP2's own cost
    and none of its saving. One launched rank is sharded over a 1-device mesh (the core shards
    wherever the ranks form a process group), so the run pays for the wrapping, the per-layer
    hooks, gathering the policy for sampling and the distributed checkpoint format, while every
    parameter still lives on the one GPU. (The service refuses ``fsdp`` with ``gpus: 1`` for
    that reason; this run asks the spec for 2 GPUs and launches 1 rank.) The ddp row is the
    1-GPU data-parallel figure: one NCCL rank through the launcher, against ``one``. With k >= 2
    GPUs, fsdp's per-GPU peak is the figure that shows the sharding (parameters, gradients and
    AdamW state ~1/k per GPU, plus the whole policy while sampling).

How it is measured
    * steps/s = 1 / median of the records' ``step_time`` after the ``--warmup`` steps (the
      trainer's own per-step clock on rank 0: sampling, scoring, reference log-probs, update,
      all collectives; not model loading, the launch or the final checkpoint). ``wall`` is the
      run's whole time, launch and load included.
    * peak memory: the records' ``peak_memory_mb``, the largest rank's: peak RSS of a process on
      CPU (so the k ranks together hold about k times it), ``torch.cuda.max_memory_allocated`` on
      CUDA.
    * ``--repeats`` runs each side that many times, in ABBA order, and pools the steps; the
      machine may be shared, so only the ratio of runs in the same invocation is meaningful.
      ``other_load``: cores' worth of CPU that processes outside the run used meanwhile (from
      ``/proc/stat``; the run's own ranks excluded), to tell a slow run from a crowded one.

Run: ``.venv/bin/python benchmarks/multi_gpu.py [--steps 20 --sharding ddp,fsdp --json-out out.json]``.
``--budget`` bounds the whole invocation in seconds: a side that would start after it is
skipped, and a running side is stopped at it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_sides import CORE_REWARDS
from _common import ForeignCpu, format_table, median, run_child, write_result

TABLE_COLUMNS = (
    "side",
    "ranks",
    "steps",
    "median_step_ms",
    "steps_per_s",
    "vs_one",
    "peak_memory_mb",
    "wall_s",
    "other_load",
)
PROMPTS = [f"Question {i}: is {i} plus {i} equal to {2 * i}? Answer yes or no." for i in range(32)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="first steps excluded from the medians")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side (ABBA order)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--nproc", type=int, default=None, help="ranks (default: 2 on CPU, every GPU on CUDA)"
    )
    parser.add_argument(
        "--sharding", default="ddp", help="comma-separated resources.sharding modes for the k-rank runs"
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="CPU threads per run (all ranks)"
    )
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=8, help="B (divisible by --nproc)")
    parser.add_argument("--num-generations", type=int, default=8, help="G")
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--budget", type=float, default=900.0, help="seconds for the whole invocation")
    parser.add_argument("--json-out", type=Path, default=None, help="write the JSON summary here")
    parser.add_argument("--keep-logs", type=Path, default=None, help="folder for the runs' logs")
    # A run of one side, in its own interpreter (started by the parent).
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def job_spec(args: argparse.Namespace, model_dir: str, sharding: str, gpus: int) -> dict[str, Any]:
    return {
        "name": "multi-gpu-bench",
        "model": {"source": f"path:{model_dir}"},
        "dataset": {"prompts": [{"prompt": p} for p in PROMPTS]},
        "rewards": CORE_REWARDS,  # core_vs_trl's: "yes" + 0.5 x closeness to 12 chars
        "reasoning": {"enabled": False},
        "grpo": {
            "num_generations": args.num_generations,
            "prompts_per_step": args.prompts_per_step,
            "max_prompt_length": 64,
            "max_completion_length": args.max_completion_length,
            "max_steps": args.warmup + args.steps,
            "learning_rate": 3e-3,
            "beta": 0.04,
            "seed": 0,
            # What the published figures ran with (the defaults before they became TRL's).
            "lr_scheduler_type": "constant",
            "gradient_checkpointing": False,
        },
        "checkpoint_every": 1_000_000,  # only the final one, which no step time includes
        "log_completions_every": 1_000_000,
        "resources": {"gpus": gpus, "sharding": sharding},
    }


def run_side(args: argparse.Namespace) -> dict[str, Any]:
    """One run (``--side one|ddp|fsdp``), in this fresh interpreter; returns its figures."""
    import torch

    from api.domain.job_spec import JobSpec
    from grpo_core.run.launch import run_data_parallel
    from grpo_core.run.local_run import run_local

    torch.set_num_threads(args.threads)
    one = args.side == "one"
    # The spec's gpus is what the service would place; the launcher starts --nproc ranks. fsdp
    # on one rank asks for 2 (the spec refuses fsdp on 1) and runs 1: see the docstring.
    gpus = 1 if one else (2 if args.side == "fsdp" and args.nproc == 1 else args.nproc)
    spec = JobSpec.model_validate(job_spec(args, args.model_dir, "ddp" if one else args.side, gpus))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="multi-gpu-bench-") as tmp:
        out = Path(tmp) / "run"
        if one:
            run_local(spec, Path(tmp), out, device=args.device, progress=False)
        else:
            run_data_parallel(spec, Path(tmp), out, args.nproc, device=args.device, progress=False)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    measured = records[args.warmup :]
    return {
        "side": args.side,
        "ranks": 1 if one else args.nproc,
        "step_times": [r["step_time"] for r in measured],
        "peak_memory_mb": max(r["peak_memory_mb"] for r in records),
        "wall_s": time.perf_counter() - started,
        "final_reward": measured[-1]["reward"],
    }


def resolve_device(requested: str) -> tuple[str, int]:
    """``(device, visible CUDA devices)``; imports torch here, in the parent, only to look."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cuda" and not gpus:
        raise SystemExit("--device cuda: no CUDA device is visible")
    return ("cuda" if gpus and requested != "cpu" else "cpu"), gpus


def plan_sides(args: argparse.Namespace, gpus: int) -> list[str]:
    """The sides to run: the 1-process reference, then each mode asked for."""
    sides = ["one"]
    for mode in [m.strip() for m in args.sharding.split(",") if m.strip()]:
        if mode not in ("ddp", "fsdp"):
            raise SystemExit(f"--sharding: unknown mode {mode!r} (ddp or fsdp)")
        sides.append(mode)
    if args.device == "cuda" and args.nproc > gpus:
        raise SystemExit(f"--nproc {args.nproc}: only {gpus} CUDA device(s) visible (one NCCL rank per GPU)")
    if args.prompts_per_step % args.nproc:
        raise SystemExit(
            f"--prompts-per-step {args.prompts_per_step} must be divisible by --nproc {args.nproc}"
        )
    return sides


def summarise(side: str, runs: list[dict[str, Any]], reference: float) -> dict[str, Any]:
    times = [t for run in runs for t in run["step_times"]]
    steps_per_s = 1.0 / median(times)
    return {
        "side": side,
        "ranks": runs[0]["ranks"],
        "steps": len(times),
        "median_step_ms": 1000 * median(times),
        "steps_per_s": steps_per_s,
        "vs_one": steps_per_s / reference if reference else float("nan"),
        "peak_memory_mb": max(run["peak_memory_mb"] for run in runs),
        "wall_s": median([run["wall_s"] for run in runs]),
        "other_load": median([run["other_load"] for run in runs]),
        "final_reward": runs[-1]["final_reward"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        write_result(args.result_file, run_side(args))
        return 0
    args.device, gpus = resolve_device(args.device)
    args.nproc = args.nproc or (gpus if args.device == "cuda" else 2)
    sides = plan_sides(args, gpus)
    deadline = time.monotonic() + args.budget
    from grpo_core.io.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="multi-gpu-bench-") as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model",
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
        )
        logs = args.keep_logs or Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                left = deadline - time.monotonic()
                if left < 10:
                    print(f"budget spent: {side} run {repeat + 1} not started", flush=True)
                    continue
                threads = args.threads if side == "one" else max(1, args.threads // args.nproc)
                child = [
                    "--side", side, "--model-dir", str(model_dir), "--device", args.device,
                    "--nproc", str(args.nproc), "--threads", str(threads),
                    "--steps", str(args.steps), "--warmup", str(args.warmup),
                    "--prompts-per-step", str(args.prompts_per_step),
                    "--num-generations", str(args.num_generations),
                    "--max-completion-length", str(args.max_completion_length),
                ]  # fmt: skip
                log = logs / f"{side}-{repeat + 1}.log"
                others, started = ForeignCpu(children=True), time.monotonic()  # ranks reaped: counted
                result = run_child(Path(__file__), child, threads, log, timeout_s=left)
                result["other_load"] = others.seconds() / (time.monotonic() - started)
                runs[side].append(result)
                print(
                    f"{side} run {repeat + 1}: median step {1000 * median(result['step_times']):.1f} ms, "
                    f"peak {result['peak_memory_mb']:.0f} MB, wall {result['wall_s']:.1f} s, "
                    f"other processes {result['other_load']:.2f} cores",
                    flush=True,
                )
    if not runs["one"]:
        print("no run of the 1-process reference finished within the budget")
        return 1
    reference = 1.0 / median([t for run in runs["one"] for t in run["step_times"]])
    rows = [summarise(side, done, reference) for side, done in runs.items() if done]
    headers = TABLE_COLUMNS
    print()
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    summary = {
        "device": args.device,
        "gpus_visible": gpus,
        "nproc": args.nproc,
        "threads": args.threads,
        "model": {"hidden_size": args.hidden_size, "num_layers": args.num_layers},
        "job": {"B": args.prompts_per_step, "G": args.num_generations, "T": args.max_completion_length},
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "sides": rows,
        "runs": runs,
    }
    print("FIGURES: " + json.dumps({r["side"]: round(r["steps_per_s"], 3) for r in rows}))
    if args.json_out:
        write_result(args.json_out, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
