"""Peak memory and time of ``selective_log_softmax`` against the naive ``log_softmax(...).gather``.

What is measured
    For fp32 logits of shape ``(N, T, V)`` on CPU (default N=16, T=512, so N*T = 8,192 tokens, and
    V = 32,000 and 150,000), the per-token log-prob of one index per position, computed by

    * ``ours``: :func:`grpo_core.algorithm.logprobs.selective_log_softmax` (chunks of ~4M elements, 16 MB,
      ``logit - logsumexp``, no ``(N, T, V)`` output);
    * ``ours+H``: :func:`grpo_core.algorithm.logprobs.selective_log_softmax_and_entropy`, the log-probs plus
      the per-token entropy, which is what the policy update computes (the backward is through
      the log-probs only; the entropy is a metric);
    * ``naive``: ``torch.log_softmax(logits, -1).gather(-1, index[..., None]).squeeze(-1)``;

    in two modes:

    * ``forward``: under ``torch.no_grad()`` (how reference / old-policy log-probs are computed);
    * ``fwd+bwd``: ``logits.requires_grad_()``, forward, then ``out.sum().backward()``. Besides the
      whole peak, the peak of the forward alone and the memory still held after it (tensors that
      autograd saved for the backward) are reported. The peak includes ``logits.grad``, which is
      as large as the logits and unavoidable for any method; the table also shows the peak
      beyond it.

    With ``--layouts contiguous,sliced`` (the default) each case also runs on the layout the
    trainer actually passes in: ``completion_logprobs`` slices ``outputs.logits[:, :-1, :]`` from
    ``(N, T+1, V)`` logits, a non-contiguous view.

How memory is measured
    Each (variant, mode, V, layout) runs in its own fresh Python process, one at a time, so only
    one variant's tensors are ever alive and allocator state cannot leak between cases. In the
    child: both functions are first run once on a small input (kernels, thread pools and the
    lazy imports are paid before measuring; the two results are compared there as a
    correctness check), then the logits and the index are allocated and filled, then
    ``VmHWM`` (the kernel's peak-RSS counter) is reset to the current RSS by writing ``5`` to
    ``/proc/self/clear_refs``, the operation runs, and the figure reported is
    ``VmHWM - VmRSS_before``: the peak increase in resident memory caused by the operation alone,
    the logits not counted (their size is reported separately). PyTorch's CPU allocator has no
    cache and blocks this large are ``mmap``-ed by glibc and returned on free, so RSS follows
    tensor lifetimes; RSS is page-granular and includes small allocator noise (a few MiB).
    Without ``clear_refs`` (non-Linux) the script falls back to ``ru_maxrss`` minus the RSS
    before, which is right only if nothing before the operation peaked higher.

    Times are wall clock of the operation (forward, backward) in the same run, with
    ``torch.set_num_threads(--threads)``; one run per case, so they are indicative.

Run: ``.venv/bin/python benchmarks/logprobs_memory.py [--vocab-sizes 32000,150000 --rows 16 --tokens 512]``.
A case whose estimated peak exceeds the memory available (``--mem-limit-gb``) is skipped and
reported as such rather than risking the OOM killer.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import current_rss_mb, format_table, peak_rss_mb, reset_peak_rss, run_child

VARIANTS = ("naive", "ours", "ours+H")
MODES = ("forward", "fwd+bwd")
# Peak on top of the logits, in logits sizes, measured at V=32k; used only to skip a case that
# cannot fit in memory (the OOM killer is not a measurement).
ESTIMATE = {
    ("naive", "forward"): 1.1,
    ("naive", "fwd+bwd"): 3.1,
    ("ours", "forward"): 0.1,
    ("ours", "fwd+bwd"): 3.1,
    ("ours+H", "forward"): 0.1,
    ("ours+H", "fwd+bwd"): 3.1,
}
SLICED_EXTRA = 1.05  # a non-contiguous input is copied once


def naive_logprobs(logits: Any, index: Any) -> Any:
    """The textbook version: materialises the whole ``(..., V)`` log-softmax."""
    import torch

    return torch.log_softmax(logits, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)


def logprobs_with_entropy(logits: Any, index: Any) -> Any:
    """Ours with the entropy as the update asks for it; the entropy is computed, then dropped."""
    from grpo_core.algorithm.logprobs import selective_log_softmax_and_entropy

    return selective_log_softmax_and_entropy(logits, index)[0]


# ----------------------------------------------------------------------------------------------
# Child: one measured case
# ----------------------------------------------------------------------------------------------
def run_case(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from grpo_core.algorithm.logprobs import selective_log_softmax

    torch.set_num_threads(args.threads)
    functions = {"naive": naive_logprobs, "ours": selective_log_softmax, "ours+H": logprobs_with_entropy}
    fn = functions[args.variant]

    # Warm-up (every variant, forward and backward) and a correctness check on a small input.
    small = torch.randn(2, 9, 1000, requires_grad=True)
    small_index = torch.randint(1000, (2, 8))
    view = small[:, :-1, :]
    ours_small, naive_small = selective_log_softmax(view, small_index), naive_logprobs(view, small_index)
    (ours_small.sum() + naive_small.sum() + logprobs_with_entropy(view, small_index).sum()).backward()
    check_diff = float((ours_small - naive_small).abs().max())
    del small, small_index, view, ours_small, naive_small
    gc.collect()

    n, t, v = args.rows, args.tokens, args.vocab
    sliced = args.layout == "sliced"
    torch.manual_seed(0)
    base = torch.randn(n, t + 1 if sliced else t, v, dtype=torch.float32)
    index = torch.randint(v, (n, t))
    if args.mode == "fwd+bwd":
        base.requires_grad_()
    logits_mb = base.numel() * base.element_size() / 2**20
    gc.collect()

    rss_before = current_rss_mb()
    exact = reset_peak_rss()
    out: dict[str, Any] = {
        "variant": args.variant,
        "mode": args.mode,
        "vocab": v,
        "rows": n,
        "tokens": t,
        "layout": args.layout,
        "logits_mb": logits_mb,
        "rss_before_mb": rss_before,
        "peak_exact": exact,
        "check_max_abs_diff": check_diff,
        "threads": args.threads,
    }
    started = time.perf_counter()
    if args.mode == "forward":
        with torch.no_grad():
            logits = base[:, :-1, :] if sliced else base
            result = fn(logits, index)
        out["forward_s"] = time.perf_counter() - started
        out["peak_increase_mb"] = peak_rss_mb() - rss_before
    else:
        logits = base[:, :-1, :] if sliced else base
        result = fn(logits, index)
        out["forward_s"] = time.perf_counter() - started
        out["forward_peak_increase_mb"] = peak_rss_mb() - rss_before
        out["held_after_forward_mb"] = current_rss_mb() - rss_before
        started = time.perf_counter()
        result.sum().backward()
        out["backward_s"] = time.perf_counter() - started
        out["peak_increase_mb"] = peak_rss_mb() - rss_before
        out["grad_mb"] = base.grad.numel() * base.grad.element_size() / 2**20
    out["result_shape"] = list(result.shape)
    out["total_s"] = out["forward_s"] + out.get("backward_s", 0.0)
    return out


# ----------------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------------
def mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def estimated_gb(variant: str, mode: str, logits_gb: float, layout: str) -> float:
    factor = 1.0 + ESTIMATE[(variant, mode)] + (SLICED_EXTRA if layout == "sliced" else 0.0)
    return factor * logits_gb + 0.5


def _mb(value: float | None) -> Any:
    return "-" if value is None else round(value)


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    by_key = {(r["variant"], r["mode"], r["vocab"], r["layout"]): r for r in results}
    blocks = []
    for layout in args.layouts:
        rows = []
        for vocab in args.vocab_sizes:
            for mode in MODES:
                naive = by_key.get(("naive", mode, vocab, layout))
                ours = by_key.get(("ours", mode, vocab, layout))
                with_entropy = by_key.get(("ours+H", mode, vocab, layout))
                logits_mb = next((r["logits_mb"] for r in (naive, ours) if r and "logits_mb" in r), None)
                rows.append(
                    [
                        f"{vocab:,}",
                        mode,
                        _mb(logits_mb),
                        _peak(naive),
                        _peak(ours),
                        _ratio(naive, ours, "peak_increase_mb"),
                        _beyond_grad(naive),
                        _beyond_grad(ours),
                        _time(naive),
                        _time(ours),
                        _peak(with_entropy),
                        _time(with_entropy),
                    ]
                )
        title = (
            f"{layout} logits, N={args.rows} x T={args.tokens} = {args.rows * args.tokens:,} tokens, "
            f"fp32, CPU, {args.threads} threads"
        )
        if layout == "sliced":
            title += " (input is logits[:, :-1, :] of an (N, T+1, V) tensor, as in completion_logprobs)"
        blocks.append(
            title
            + "\n"
            + format_table(
                [
                    "V",
                    "mode",
                    "logits MiB",
                    "naive peak +MiB",
                    "ours peak +MiB",
                    "naive/ours",
                    "naive beyond grad",
                    "ours beyond grad",
                    "naive s",
                    "ours s",
                    "ours+H peak +MiB",
                    "ours+H s",
                ],
                rows,
            )
        )
    detail = []
    for r in results:
        if r.get("mode") == "fwd+bwd" and "forward_peak_increase_mb" in r:
            detail.append(
                [
                    r["variant"],
                    f"{r['vocab']:,}",
                    r["layout"],
                    round(r["forward_peak_increase_mb"]),
                    round(r["held_after_forward_mb"]),
                    round(r["peak_increase_mb"]),
                    round(r["grad_mb"]),
                    f"{r['forward_s']:.2f}",
                    f"{r['backward_s']:.2f}",
                ]
            )
    blocks.append(
        "fwd+bwd detail (MiB above the logits; held = kept for backward after the forward):\n"
        + format_table(
            ["variant", "V", "layout", "fwd peak", "held", "fwd+bwd peak", "logits.grad", "fwd s", "bwd s"],
            detail,
        )
    )
    skipped = [r for r in results if "skipped" in r or "error" in r]
    if skipped:
        blocks.append(
            "Not measured:\n"
            + "\n".join(
                f"  {r['variant']} {r['mode']} V={r['vocab']:,} {r['layout']}: "
                f"{r.get('skipped') or r.get('error')}"
                for r in skipped
            )
        )
    diffs = [r["check_max_abs_diff"] for r in results if "check_max_abs_diff" in r]
    if diffs:
        blocks.append(f"Correctness (small input, ours vs naive): max |diff| = {max(diffs):.2g}")
    return "\n\n".join(blocks)


def _peak(r: dict[str, Any] | None) -> Any:
    return "n/a" if not r or "peak_increase_mb" not in r else round(r["peak_increase_mb"])


def _beyond_grad(r: dict[str, Any] | None) -> Any:
    if not r or "peak_increase_mb" not in r:
        return "n/a"
    return round(r["peak_increase_mb"] - r.get("grad_mb", 0.0)) if "grad_mb" in r else "-"


def _ratio(naive: dict[str, Any] | None, ours: dict[str, Any] | None, key: str) -> Any:
    if not naive or not ours or key not in naive or key not in ours:
        return "n/a"
    return f"{naive[key] / max(ours[key], 1.0):.1f}x"


def _time(r: dict[str, Any] | None) -> Any:
    return "n/a" if not r or "total_s" not in r else f"{r['total_s']:.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--vocab-sizes", default="32000,150000", help="comma-separated V values")
    parser.add_argument("--rows", type=int, default=16, help="N (sequences)")
    parser.add_argument("--tokens", type=int, default=512, help="T (completion tokens per sequence)")
    parser.add_argument("--layouts", default="contiguous,sliced", help="contiguous and/or sliced")
    parser.add_argument("--modes", default=",".join(MODES), help="forward and/or fwd+bwd")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="any of " + ", ".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--mem-limit-gb",
        type=float,
        default=None,
        help="skip a case whose estimated peak is above this many GiB; unset: 95%% of MemAvailable at start",
    )
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    # Internal: a child process measures one case.
    parser.add_argument("--variant", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--layout", choices=("contiguous", "sliced"), default="contiguous", help=argparse.SUPPRESS
    )
    parser.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if isinstance(args.vocab_sizes, str):
        args.vocab_sizes = [int(v) for v in args.vocab_sizes.split(",") if v]
    args.layouts = [x for x in args.layouts.split(",") if x]
    args.modes = [x for x in args.modes.split(",") if x]
    args.variants = [x for x in args.variants.split(",") if x]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.variant is not None:
        Path(args.result_file).write_text(json.dumps(run_case(args)))
        return 0
    limit = args.mem_limit_gb if args.mem_limit_gb is not None else 0.95 * mem_available_gb()
    script = Path(__file__).resolve()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-logprobs-") as tmp:
        for layout in args.layouts:
            for vocab in args.vocab_sizes:
                logits_gb = args.rows * (args.tokens + (layout == "sliced")) * vocab * 4 / 2**30
                for mode in args.modes:
                    for variant in args.variants:
                        case = {"variant": variant, "mode": mode, "vocab": vocab, "layout": layout}
                        need = estimated_gb(variant, mode, logits_gb, layout)
                        label = f"{variant:6s} {mode:7s} V={vocab:>7,} {layout}"
                        if need > limit:
                            print(f"skip {label}: estimated {need:.1f} GiB > {limit:.1f} GiB", flush=True)
                            results.append(case | {"skipped": f"estimated {need:.1f} GiB > {limit:.1f} GiB"})
                            continue
                        print(f"run  {label} ...", end=" ", flush=True)
                        child = [
                            "--variant",
                            variant,
                            "--mode",
                            mode,
                            "--vocab",
                            str(vocab),
                            "--layout",
                            layout,
                            "--rows",
                            str(args.rows),
                            "--tokens",
                            str(args.tokens),
                            "--threads",
                            str(args.threads),
                        ]
                        try:
                            log = Path(tmp) / "case.log"
                            result = run_child(script, child, args.threads, log, args.timeout)
                        except Exception as exc:  # an OOM kill or a crash is a result worth reporting
                            print("failed", flush=True)
                            results.append(case | {"error": str(exc).splitlines()[0][:200]})
                            continue
                        print(
                            f"peak +{result['peak_increase_mb']:,.0f} MiB in {result['total_s']:.2f} s",
                            flush=True,
                        )
                        results.append(result)
    print()
    print(render(results, args))
    if args.json_out is not None:
        config = {
            "rows": args.rows,
            "tokens": args.tokens,
            "vocab_sizes": args.vocab_sizes,
            "threads": args.threads,
        }
        args.json_out.write_text(json.dumps({"config": config, "results": results}, indent=2))
        print(f"\nJSON written to {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
