"""``grpo`` command line. Exit codes: 0 success, 1 training failed, 2 bad input.

``grpo train`` reads a :class:`RunSpec`: a field it does not have (a service's ``priority``) is
refused, naming it. A caller that knows a richer spec passes its own reader (``load_spec``): the
service's console reads its job specs, warning about the fields a local run ignores.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from grpo_core.errors import GRPOError, SpecError, SpecWarning
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint, parse_verifier_option
from grpo_core.spec.run_spec import RunSpec
from grpo_core.spec.spec_file import InvalidSpec, load_spec_file, with_changes

# A spec file -> the spec to run and what to warn about; raises InvalidSpec or SpecError.
SpecLoader = Callable[[Path], tuple[RunSpec, list[SpecWarning]]]


def load_run_spec(path: Path) -> tuple[RunSpec, list[SpecWarning]]:
    spec = load_spec_file(path)
    return spec, spec.warnings()


def _train(args: argparse.Namespace) -> int:
    from grpo_core.run.local_run import run_local

    spec, warnings = args.load_spec(args.spec)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.max_steps is not None:
        spec = with_changes(spec, {"grpo": {"max_steps": args.max_steps}})
    nproc = args.nproc_per_node or spec.resources.gpus
    if nproc > 1:
        from grpo_core.run.launch import run_data_parallel

        result = run_data_parallel(
            spec, args.spec.resolve().parent, args.output_dir, nproc, args.resume, args.device,
            progress=not args.quiet, verifiers=dict(args.verifier),
        )
    else:
        result = run_local(
            spec, args.spec.resolve().parent, args.output_dir, args.resume, args.device,
            progress=not args.quiet, verifiers=dict(args.verifier),
        )
    if result.alert is not None:
        print(f"stopped at step {result.step} by the {result.alert.rule} health rule "
              f"({result.alert.message}); checkpoint: {result.checkpoint}")
    else:
        ended = "stopped early (grpo.early_stopping_patience)" if result.early_stopped else "finished"
        print(f"{ended} at step {result.step}; checkpoint: {result.checkpoint}")
    if result.best_summary is not None:
        best = result.best_summary
        print(f"best checkpoint: {result.best} ({best['metric']} {best['value']:.4g} at step {best['step']})")
    return 0


def _verifier(text: str) -> tuple[str, VerifierEndpoint]:
    try:
        return parse_verifier_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tiny_model(args: argparse.Namespace) -> int:
    from grpo_core.io.tiny_models import build_tiny_model

    path = build_tiny_model(
        args.output_dir,
        family=args.family,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        seed=args.seed,
        num_labels=args.num_labels,
    )
    kind = "model" if args.num_labels is None else f"reward model ({args.num_labels} logits)"
    print(f"wrote a tiny {args.family} {kind} to {path}")
    return 0


def build_parser(load_spec: SpecLoader = load_run_spec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo", description="GRPO fine-tuning: local runs and the job service."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser(
        "train", help="run a job spec on this machine", description="Run a job spec on this machine.",
        epilog="Every field of a spec is described, with its default and bounds, at /docs of a running "
        "service, schema JobSpec (`grpo dev` serves one at http://127.0.0.1:8000/docs); docs/user_guide.md "
        "explains TRL's names (under grpo:) and the rewards, and examples/*.yaml show them in use.")
    train.add_argument("spec", type=Path, help="YAML or JSON JobSpec")
    train.add_argument("--output-dir", type=Path, required=True)
    train.add_argument("--max-steps", type=int, default=None, help="override grpo.max_steps")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the dir")
    train.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when present)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument(
        "--nproc-per-node", type=int, default=None,
        help="data-parallel ranks (default: the spec's resources.gpus); gloo on CPU, NCCL on CUDA",
    )
    train.add_argument(
        "--verifier", type=_verifier, action="append", default=[], metavar="NAME=URL",
        help="a verifier service http_verifier rewards may name (repeatable; the service registers "
             "them with `grpo admin set-verifier` instead)",
    )
    train.set_defaults(handler=_train, load_spec=load_spec)

    tiny = commands.add_parser("tiny-model", help="write a tiny random-init model + tokenizer (no network)")
    tiny.add_argument("output_dir", type=Path)
    tiny.add_argument("--family", choices=["llama", "qwen2", "gpt2"], default="llama")
    tiny.add_argument("--hidden-size", type=int, default=64)
    tiny.add_argument("--num-layers", type=int, default=2)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--num-labels", type=int, default=None,
                      help="write a sequence classifier with this many logits (a reward model) instead")
    tiny.set_defaults(handler=_tiny_model)
    return parser


def main(argv: list[str] | None = None, load_spec: SpecLoader = load_run_spec) -> int:
    args = build_parser(load_spec).parse_args(argv)
    from grpo_core.io.model_loading import quiet_library_progress_bars  # torch: only once a command runs

    quiet_library_progress_bars()
    if getattr(args, "max_steps", None) is not None and args.max_steps < 1:
        print("error: --max-steps: must be >= 1", file=sys.stderr)
        return 2
    if getattr(args, "nproc_per_node", None) is not None and args.nproc_per_node < 1:
        print("error: --nproc-per-node: must be >= 1", file=sys.stderr)
        return 2
    return run_handler(args)


def run_handler(args: argparse.Namespace) -> int:
    """Run a subcommand, mapping errors to exit codes: 2 bad input, 1 training failure.
    Shared with the service CLI, whose commands take the same specs."""
    try:
        return args.handler(args)
    except InvalidSpec as exc:
        for error in exc.errors:
            print(f"error: {error}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except GRPOError as exc:
        print(f"training failed [{exc.code}]: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
