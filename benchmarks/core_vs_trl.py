"""Our GRPO core against TRL's ``GRPOTrainer``: step time, reward curve and peak memory, on CPU.

What is compared
    Both trainers start from the same random-init tiny model folder (``grpo_core.io.tiny_models``, built
    once per run into a temp dir), see the same 32 prompts and the same reward, and use the same
    GRPO hyper-parameters: B prompts x G completions per step, ``max_completion_length``,
    temperature 1.0, ``beta`` (0.04 by default, so both keep a reference model), learning rate
    (constant schedule, no warm-up, no weight decay), ``loss_type="dapo"``, epsilon 0.2 /
    epsilon_high 0.28, ``max_grad_norm`` 1.0, one optimizer step per generation batch, fp32,
    no gradient checkpointing, the same seed and the same ``torch.set_num_threads``.

    The reward is ``1.0 * ("yes" in answer) + 0.5 * max(0, 1 - |len(answer) - 12| / 12)`` with
    ``answer = completion.strip()``. TRL gets it as the plain Python function
    :func:`say_yes_reward`; our core gets it from its registry as the built-ins ``contains``
    (``text: "yes"``, weight 1.0) and ``length_target`` (``target: 12, unit: chars``, weight 0.5),
    with ``reasoning.enabled: false`` so the answer is the stripped completion as TRL sees it.
    The core side checks, before training, that both give identical values on a fixed list of
    strings, and after step 1 on that step's real completions.

How it is measured
    Each side runs in its own fresh interpreter (``--side trl`` / ``--side core``), so imports,
    allocator state and peak memory are per side; the parent imports neither torch nor TRL.

    * Step time. TRL: wall clock from ``TrainerCallback.on_step_begin`` to ``on_step_end``
      (generation, reward, reference log-probs, forward, backward, clipping, optimizer step; not
      the prompt fetch or logging). Ours: the ``step_time`` field of each ``on_step`` record,
      measured by the trainer over the same work (``GRPOTrainer._one_step`` from entry to after
      the optimizer step; not the metric record or the callbacks). Also reported for both: the
      wall-clock interval between consecutive step ends, which includes everything. The first
      ``--warmup`` steps are excluded from medians; speed = 1 / median step time.
    * Reward: the per-step mean reward, from TRL's ``on_log`` logs (``logging_steps=1``) and from
      our records' ``reward``. "Final reward" is the mean of the last 5 steps. Run ``r`` of
      ``--repeats`` uses seed ``--seed + r`` on both sides, so each repeat is an independent curve
      (one seed repeats one curve exactly on CPU) and the final reward is their mean.
    * Peak memory: ``VmHWM`` (peak resident set of the process) read at the last step's end,
      i.e. model load plus every training step, before any end-of-training save. ``ru_maxrss``
      at exit is recorded in the JSON too.
    * Per-phase breakdown: ours from the records' ``timing/*`` fields; TRL by timing its own
      methods (generation, reward, no-grad log-prob passes) in a thin subclass. On both sides,
      forward hooks on the policy and reference models and a wrapper around ``Tensor.backward``
      also time the model's forward calls and the backward pass; our sampling runs the model's
      modules through ``grpo_core.algorithm.decoders.LeanDecoder`` instead of its forward, and those calls
      are timed as forward too. "rest" (step minus both) is the trainer's own cost.
    * Schedule. By default (``--schedule lockstep``) both children are alive at once but only
      one runs at a time, step by step: they block before each step on a pipe from the parent,
      which lets step k of TRL and step k of ours run back to back (who goes first alternates
      every step) and never lets anything of the other process run meanwhile. Load from other
      processes on a shared machine then hits both sides alike, and the per-pair ratio is a
      paired measurement. The price: each process's caches go cold between its steps and its
      OpenMP threads fall asleep, so absolute step times are ~10% above a process running alone;
      ``--schedule sequential`` runs one whole side after the other (ABBA over ``--repeats``)
      for those figures. The time a child spends blocked is excluded from its step intervals.
    * Noise. Each step also records the CPU time other processes used during it (``/proc/stat``
      minus this process); a step is "quiet" when that is under 10% of one core. The speed target
      is judged on the quiet steps when each side has enough of them (>= 25% of its steps), else
      on all steps; all-step and paired figures are printed beside it. The steps of all
      ``--repeats`` runs are pooled.

Targets (printed as PASS/FAIL)
    * speed: ours >= 1.3x TRL in steps/s (ratio of median step times).
    * reward: ours_final >= trl_final - tol, with tol = 2 * sqrt(se_ours^2 + se_trl^2) and se the
      standard error of each side's last-5-step mean (the runs use different random streams,
      so an exact tie is not expected).
    * memory: ours peak RSS <= TRL's.

Realistic preset (issue 14)
    ``--preset realistic`` swaps the tiny Llama for a ~31M-parameter Qwen2-style model with a
    32k byte-level BPE vocabulary trained on the Python standard library's sources (cached under
    ``benchmarks/.cache/``; see ``_bench_realistic.py``), 128 completion tokens, lr 1e-4, and runs
    beta 0.04 then beta 0, each as one lock-step run of both sides. A third child, the compute
    floor (plain decode of the same token count, one reference forward, one forward+backward, one
    fused AdamW step on the same model and batch shape), joins the first run's rotation. It ends
    with one table: ours and TRL s/step, the floor, ours/TRL steps/s, ours/floor and the peak
    RSS ratio per beta (targets 2.0x, 1.2x, 0.5). Defaults 1 warm-up + 5 measured steps, 1 run.

Long-prompt preset (issue 36)
    ``--preset long-prompt`` is the realistic preset with a ~500-token document (the start of one
    standard-library module, a different one per question) before each question: prompts of
    509-515 tokens, where GRPO's G rows of one prompt carry most of a step's tokens. Targets
    10x TRL and 0.3x the floor (whose rows repeat each prompt, as a plain forward does).

Run: ``.venv/bin/python benchmarks/core_vs_trl.py [--steps 30 --warmup 3 --json-out out.json]``;
``.venv/bin/python benchmarks/core_vs_trl.py --preset long-prompt [--steps 3 --warmup 1]``;
``.venv/bin/python benchmarks/core_vs_trl.py --preset realistic [--steps 5 --json-out out.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_realistic import BETAS, REALISTIC, TARGETS, floor_seconds, render_realistic, side_floor
from _bench_report import compare, paired_ratio, render, summarise
from _bench_side_core import side_core
from _bench_side_trl import side_trl
from _bench_sides import REALISTIC_PRESETS, side_build
from _common import child_env, run_child, write_result


@dataclass
class _Child:
    side: str
    proc: subprocess.Popen[bytes]
    go_fd: int
    done_fd: int
    log_path: Path
    result_path: Path
    idle: bool = False


def _expect(child: _Child, byte: bytes, timeout_s: float) -> None:
    ready, _, _ = select.select([child.done_fd], [], [], timeout_s)
    data = os.read(child.done_fd, 1) if ready else b"(timeout)"
    if data != byte:
        child.proc.kill()
        tail = "\n".join(child.log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{child.side} side: expected {byte!r}, got {data!r}; log tail:\n{tail}")


def run_lockstep(
    script: Path,
    args: argparse.Namespace,
    model_dir: str,
    logs: Path,
    repeat: int,
    tmp: Path,
    sides: tuple[str, ...] = ("trl", "core"),
) -> dict[str, dict[str, Any]]:
    """Run both sides at once but one *step* at a time, alternating TRL and ours step by step.

    Both children load their models concurrently, then block before every step until this
    process lets exactly one of them run: step k of TRL and step k of ours run back to back
    (which goes first alternates every step), and nothing else of either process runs at the
    same time. On a shared machine, load from other processes then hits both sides alike instead
    of whichever side happened to be running; each side's memory is still its own process's.
    A third side (the realistic preset's floor) joins the rotation: who goes first rotates.
    """
    children: dict[str, _Child] = {}
    try:
        for side in sides:
            go_read, go_write = os.pipe()
            done_read, done_write = os.pipe()
            log_path = logs / f"{side}-{args.beta}-{repeat + 1}.log"
            result_path = tmp / f"{side}-{args.beta}-{repeat + 1}.json"
            command = [
                sys.executable,
                str(script),
                *_child_args(args, side, model_dir, repeat),
                "--sync-fds",
                f"{go_read},{done_write}",
                "--result-file",
                str(result_path),
            ]
            with log_path.open("w") as log:
                proc = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env(args.threads),
                    pass_fds=(go_read, done_write),
                )
            os.close(go_read)
            os.close(done_write)
            children[side] = _Child(side, proc, go_write, done_read, log_path, result_path)
        order = [s.strip() for s in args.order.split(",")] + [s for s in sides if s not in ("trl", "core")]
        for step in range(args.warmup + args.steps):
            shift = (step + repeat) % len(order)  # with two sides: alternate who goes first
            for side in order[shift:] + order[:shift]:
                for child in children.values():  # everyone idle before anyone runs
                    if not child.idle:
                        _expect(child, b"R", args.timeout)
                        child.idle = True
                os.write(children[side].go_fd, b"G")
                children[side].idle = False
                _expect(children[side], b"D", args.timeout)
        for child in children.values():  # final barrier, then let both finish
            if not child.idle:
                _expect(child, b"R", args.timeout)
        results = {}
        for child in children.values():
            os.write(child.go_fd, b"G")
            if child.proc.wait(timeout=args.timeout) != 0:
                tail = "\n".join(child.log_path.read_text(errors="replace").splitlines()[-40:])
                raise RuntimeError(f"{child.side} side exited with {child.proc.returncode}:\n{tail}")
            results[child.side] = json.loads(child.result_path.read_text())
        return results
    finally:
        for child in children.values():
            if child.proc.poll() is None:
                child.proc.kill()
            for fd in (child.go_fd, child.done_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--preset",
        choices=["tiny", *REALISTIC_PRESETS],
        default="tiny",
        help="tiny: the options below; realistic: a ~31M-parameter Qwen2-style model, 32k vocab, "
        "128 tokens, beta 0.04 and 0 in turn, plus the compute floor (options given explicitly win); "
        "long-prompt: realistic with a ~500-token document before each question",
    )
    parser.add_argument("--steps", type=int, default=30, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="extra first steps excluded from medians")
    parser.add_argument(
        "--schedule",
        choices=["lockstep", "sequential"],
        default="lockstep",
        help="lockstep: both sides alive, steps alternate one by one (robust to load from "
        "other processes); sequential: one whole run after the other",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per side; the order alternates between runs (and, in lockstep, steps)",
    )
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2", "gpt2"])
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=4, help="B")
    parser.add_argument("--num-generations", type=int, default=8, help="G")
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads on both sides"
    )
    parser.add_argument("--order", default="trl,core", help="which side runs first in run 1")
    parser.add_argument("--json-out", type=Path, default=None, help="write the JSON summary here")
    parser.add_argument("--keep-logs", type=Path, default=None, help="folder for the children's logs")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    # Internal: a child process runs one side.
    parser.add_argument(
        "--side", choices=["build", "core", "trl", "floor"], default=None, help=argparse.SUPPRESS
    )
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sync-fds", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile",
        default=None,
        help="(with --side core|trl --model-dir DIR) write cProfile stats of training here",
    )
    args = parser.parse_args(argv)
    if args.preset in REALISTIC_PRESETS and args.side is None:
        for name, value in REALISTIC.items():
            if name in vars(args) and getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


CHILD_FLAGS = (
    "preset",
    "steps",
    "warmup",
    "family",
    "hidden_size",
    "num_layers",
    "num_heads",
    "prompts_per_step",
    "num_generations",
    "max_completion_length",
    "beta",
    "learning_rate",
    "seed",
    "threads",
)


def _child_args(args: argparse.Namespace, side: str, model_dir: str, repeat: int = 0) -> list[str]:
    """Run ``repeat`` trains with seed ``--seed + repeat`` on both sides: on CPU one seed repeats
    one curve exactly, so only new seeds make the repeats independent samples of the reward."""
    out = ["--side", side, "--model-dir", model_dir]
    for name in CHILD_FLAGS:
        value = getattr(args, name) + repeat if name == "seed" else getattr(args, name)
        out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def _build_model(script: Path, args: argparse.Namespace, tmp: Path) -> tuple[Path, str, dict[str, Any]]:
    """The logs folder, the model folder both sides load, and what the build child reports."""
    logs = args.keep_logs or tmp
    logs.mkdir(parents=True, exist_ok=True)
    model_dir = str(tmp / "model")
    print(f"building the {args.preset} model in {model_dir} ...", flush=True)
    build = run_child(
        script, _child_args(args, "build", model_dir), args.threads, logs / "build.log", args.timeout
    )
    print(f"{build['parameters']:,} parameters, vocab {build['vocab_size']:,}", flush=True)
    return logs, model_dir, build


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side is not None:
        runner = {"build": side_build, "core": side_core, "trl": side_trl, "floor": side_floor}[args.side]
        write_result(args.result_file, runner(args))
        return 0
    script = Path(__file__).resolve()
    order = [s.strip() for s in args.order.split(",")]
    if sorted(order) != ["core", "trl"]:
        raise SystemExit("--order must name core and trl, e.g. 'trl,core'")
    if args.preset in REALISTIC_PRESETS:
        return main_realistic(script, args)
    raw: dict[str, list[dict[str, Any]]] = {"trl": [], "core": []}
    with tempfile.TemporaryDirectory(prefix="bench-core-vs-trl-") as tmp:
        logs, model_dir, build = _build_model(script, args, Path(tmp))
        for repeat in range(args.repeats):
            started = time.perf_counter()
            if args.schedule == "lockstep":
                print(
                    f"run {repeat + 1}: both sides in lock-step ({args.warmup}+{args.steps} steps) ...",
                    end=" ",
                    flush=True,
                )
                for side, result in run_lockstep(script, args, model_dir, logs, repeat, Path(tmp)).items():
                    raw[side].append(result)
                print(f"{time.perf_counter() - started:.0f} s", flush=True)
                continue
            for side in order if repeat % 2 == 0 else order[::-1]:
                print(f"run {repeat + 1}: {side} ({args.warmup}+{args.steps} steps) ...", end=" ", flush=True)
                started = time.perf_counter()
                raw[side].append(
                    run_child(
                        script,
                        _child_args(args, side, model_dir, repeat),
                        args.threads,
                        logs / f"{side}-{repeat + 1}.log",
                        args.timeout,
                    )
                )
                print(f"{time.perf_counter() - started:.0f} s", flush=True)
    summary = {side: summarise(raw[side], args.warmup) for side in ("core", "trl")}
    paired = paired_ratio(raw, args.warmup) if args.schedule == "lockstep" else math.nan
    verdict = compare(summary["core"], summary["trl"], paired)
    print()
    print(render(args, build, raw, summary, verdict))
    if args.json_out is not None:
        payload = {
            "config": {name: getattr(args, name) for name in CHILD_FLAGS}
            | {"order": order, "repeats": args.repeats, "schedule": args.schedule},
            "model": build,
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "summary": summary,
            "verdict": verdict,
            "raw": raw,
        }
        args.json_out.write_text(json.dumps(payload, indent=2))
        print(f"\nJSON summary written to {args.json_out}")
    return 0


def main_realistic(script: Path, args: argparse.Namespace) -> int:
    """Both betas in turn, each a lock-step run of TRL and ours; the floor joins the first one."""
    results, floor_run = [], None
    with tempfile.TemporaryDirectory(prefix="bench-core-vs-trl-") as tmp:
        logs, model_dir, build = _build_model(script, args, Path(tmp))
        for beta in BETAS:
            run_args = argparse.Namespace(**vars(args) | {"beta": beta})
            sides = ("trl", "core", "floor") if floor_run is None else ("trl", "core")
            raw: dict[str, list[dict[str, Any]]] = {"trl": [], "core": []}
            for repeat in range(args.repeats):
                started = time.perf_counter()
                print(
                    f"beta {beta}, run {repeat + 1}: {', '.join(sides)} in lock-step "
                    f"({args.warmup}+{args.steps} steps) ...",
                    end=" ",
                    flush=True,
                )
                for side, result in run_lockstep(
                    script, run_args, model_dir, logs, repeat, Path(tmp), sides
                ).items():
                    if side == "floor":
                        floor_run = result
                    else:
                        raw[side].append(result)
                print(f"{time.perf_counter() - started:.0f} s", flush=True)
            summary = {side: summarise(raw[side], args.warmup) for side in ("core", "trl")}
            speed_target, _, memory_target = TARGETS[args.preset]
            verdict = compare(
                summary["core"], summary["trl"], paired_ratio(raw, args.warmup), speed_target, memory_target
            )
            assert floor_run is not None
            step_floor = floor_seconds(floor_run, args.warmup, beta)["total"]
            print(f"\n=== beta {beta} ===")
            print(render(run_args, build, raw, summary, verdict))
            results.append(
                {"beta": beta, "summary": summary, "verdict": verdict, "floor_s": step_floor, "raw": raw}
            )
    floor = floor_seconds(floor_run, args.warmup, BETAS[0])
    print()
    print(render_realistic(results, floor, TARGETS[args.preset]))
    if args.json_out is not None:
        payload = {
            "config": {name: getattr(args, name) for name in CHILD_FLAGS} | {"repeats": args.repeats},
            "model": build,
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "floor": floor_run | {"medians": floor},
            "results": results,
        }
        args.json_out.write_text(json.dumps(payload, indent=2))
        print(f"\nJSON summary written to {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
