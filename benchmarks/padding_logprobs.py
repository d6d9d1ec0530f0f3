"""The shared-prompt log-prob pass with completions that end early: only their real tokens go
through the LM head and the log-softmax (``grpo_core.algorithm.shared_prompts``).

Rows: B prompts of ``--prompt-tokens`` random tokens, G completions each of up to ``--tokens``,
whose lengths are drawn uniformly from [8, tokens] (GRPO's rows of one prompt end at very
different lengths). "Before" is the same pass over the same rows with every position scored,
which is what the pass computed for padded rows until this change (the padding went through
the LM head too); "after" is the pass on the padded rows. Forward alone (the reference's and
the old policy's passes) and forward + backward (the update), interleaved ABBA, min of the
repeats after one warm-up. The model is the realistic preset's shape (31M parameters, 32k
vocabulary), random weights.

Run: ``.venv/bin/python benchmarks/padding_logprobs.py [--repeats 4]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from _bench_realistic import build_realistic_model
    from transformers import AutoModelForCausalLM

    from grpo_core.algorithm.rollout import Rollout
    from grpo_core.algorithm.shared_prompts import rollout_logprobs

    with tempfile.TemporaryDirectory(prefix="padding-logprobs-") as tmp:
        model = AutoModelForCausalLM.from_pretrained(build_realistic_model(str(Path(tmp) / "model"), 0))
    n, t, vocab = args.prompts * args.generations, args.tokens, model.config.vocab_size
    prompts = torch.randint(5, vocab, (args.prompts, args.prompt_tokens))
    prompts = prompts.repeat_interleave(args.generations, 0)
    prompt_mask = torch.ones_like(prompts)
    completions = torch.randint(5, vocab, (n, t))
    lengths = torch.randint(8, t + 1, (n,))
    real = (torch.arange(t)[None, :] < lengths[:, None]).long()
    never_ends = torch.zeros(n, dtype=torch.bool)
    every_position = Rollout(prompts, prompt_mask, completions, torch.ones_like(completions), never_ends)
    padded = Rollout(prompts, prompt_mask, completions.masked_fill(real == 0, 0), real, never_ends)
    mean_length = float(real.sum(1).float().mean())
    print(f"{n} rows, prompts of {args.prompt_tokens} tokens, completions {mean_length:.1f} real tokens of "
          f"{t} on average", flush=True)

    def timed(rows: Rollout, backward: bool) -> float:
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        with torch.set_grad_enabled(backward):
            logp, _ = rollout_logprobs(model, rows, 1.0, with_entropy=backward)
            if backward:
                (logp * rows.completion_mask).sum().backward()
        return time.perf_counter() - started

    print(f"{'pass':<18} {'before s':>9} {'after s':>8} {'after/before':>13}")
    for backward in (False, True):
        times: dict[str, list[float]] = {"before": [], "after": []}
        for repeat in range(args.repeats + 1):
            order = [("before", every_position), ("after", padded)]
            for name, rows in order if repeat % 2 == 0 else order[::-1]:
                elapsed = timed(rows, backward)
                if repeat:  # the first round warms up
                    times[name].append(elapsed)
        before, after = min(times["before"]), min(times["after"])
        label = "forward+backward" if backward else "forward"
        print(f"{label:<18} {before:>9.3f} {after:>8.3f} {after / before:>12.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
