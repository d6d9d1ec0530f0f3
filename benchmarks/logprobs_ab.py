"""Time of ``grpo_core/algorithm/logprobs.py`` at a git revision against the working tree's, interleaved.

What is measured
    On fp32 logits ``(N, T, V)`` (random normal, std 3) on the CPU, three calls of
    ``selective_log_softmax_and_entropy``, each as the trainer makes it:

    * ``logp``: log-probs alone under ``no_grad`` (the reference and old-policy passes);
    * ``logp+H``: log-probs and entropy under ``no_grad``;
    * ``logp+H+bwd``: log-probs and entropy, then ``logp.sum().backward()`` (the policy update).

How
    The revision's file is read with ``git show REV:grpo_core/algorithm/logprobs.py`` and loaded as a module
    of its own beside the working tree's, in one process, on the same tensors. Each repeat runs
    both versions, in alternating order, so a burst of load from other processes falls on both
    sides; the minimum and the median of the repeats are reported, and their ratio is the figure
    (absolute times on a shared machine are indicative only). Each side's log-probs and entropies
    are also compared with an fp64 ``log_softmax`` of the same logits (max absolute error).

Run: ``.venv/bin/python benchmarks/logprobs_ab.py --baseline REV [--vocab-sizes 32000,151936,256000]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table

REPO = Path(__file__).resolve().parent.parent
CASES = ("logp", "logp+H", "logp+H+bwd")


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def baseline_module(revision: str, folder: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{revision}:grpo_core/algorithm/logprobs.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / "baseline_logprobs.py"
    path.write_text(source)
    return load_module("baseline_logprobs", path)


def call(module: ModuleType, case: str, logits, index) -> Callable[[], tuple]:
    """The timed call of ``case``; it returns ``(logp, entropy or None)``, detached."""
    import torch

    def run() -> tuple:
        if case == "logp+H+bwd":
            logits.grad = None
            logp, entropy = module.selective_log_softmax_and_entropy(logits, index, 1.0, with_entropy=True)
            logp.sum().backward()
            return logp.detach(), entropy
        with torch.no_grad():
            return module.selective_log_softmax_and_entropy(logits, index, 1.0, with_entropy=case != "logp")

    return run


def fp64_reference(logits, index) -> tuple:
    """fp64 log-probs and entropies, a few tokens at a time (the fp64 log-softmax is 2x the logits)."""
    import torch

    logps, entropies = [], []
    for part, part_index in zip(logits.split(64, dim=1), index.split(64, dim=1), strict=True):
        log_probs = torch.log_softmax(part.double(), dim=-1)
        logps.append(log_probs.gather(-1, part_index.unsqueeze(-1)).squeeze(-1))
        entropies.append(-(log_probs.exp() * log_probs).sum(-1))
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1)


def _error(value, reference) -> str:
    return "-" if value is None else f"{float((value.double() - reference).abs().max()):.1e}"


def measure(sides: dict[str, ModuleType], vocab: int, args: argparse.Namespace) -> list[list[object]]:
    import torch

    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(args.rows, args.tokens, vocab, generator=gen) * 3.0
    index = torch.randint(0, vocab, (args.rows, args.tokens), generator=gen)
    reference = fp64_reference(logits, index)
    rows = []
    for case in CASES:
        source = logits.clone().requires_grad_(True) if case == "logp+H+bwd" else logits
        runs = {name: call(module, case, source, index) for name, module in sides.items()}
        times: dict[str, list[float]] = {name: [] for name in sides}
        outputs = {}
        for repeat in range(args.repeats):
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
            for name in order:
                started = time.perf_counter()
                outputs[name] = runs[name]()
                times[name].append(time.perf_counter() - started)
        base, new = times["baseline"], times["working tree"]
        errors = [_error(outputs[side][k], reference[k]) for k in (0, 1) for side in sides]
        rows.append(
            [
                f"{vocab:,}",
                case,
                min(base),
                min(new),
                f"{min(new) / min(base):.2f}",
                statistics.median(base),
                statistics.median(new),
                f"{statistics.median(new) / statistics.median(base):.2f}",
                *errors,
            ]
        )
        print(f"  V={vocab:,} {case}: new/base min {rows[-1][4]}, median {rows[-1][7]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision whose logprobs.py is the baseline")
    parser.add_argument("--vocab-sizes", default="32000,151936,256000")
    parser.add_argument("--rows", type=int, default=1, help="N (sequences)")
    parser.add_argument("--tokens", type=int, default=1024, help="T (tokens per sequence)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-logprobs-ab-") as tmp:
        sides = {
            "baseline": baseline_module(args.baseline, Path(tmp)),
            "working tree": load_module("working_logprobs", REPO / "grpo_core" / "algorithm" / "logprobs.py"),
        }
        rows = [row for vocab in args.vocab_sizes.split(",") for row in measure(sides, int(vocab), args)]
    print(
        f"\n{args.rows} x {args.tokens} tokens, fp32, CPU, {args.threads} threads, {args.repeats} repeats; "
        f"baseline {args.baseline}, times in s"
    )
    headers = ["V", "call", "base min", "new min", "new/base"]
    headers += ["base median", "new median", "new/base", "base logp err", "new logp err"]
    headers += ["base H err", "new H err"]
    print(format_table(headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
