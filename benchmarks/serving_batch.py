"""Chat serving: N concurrent requests through the serving engine (grpo_core.serving) against the
same requests answered one after another by ``model.generate``.

What is measured
    N greedy requests of T new tokens each (EOS off on every side, so each produces exactly T
    tokens and both sides do the same work), on a random-init Llama built locally (the tiny
    model, or widened with ``--hidden``/``--layers``):

    * ``generate, one by one``: ``model.generate`` on each request's rendered prompt in turn,
      the way a server without batching answers them;
    * ``engine, all at once``: all N submitted together, then ``run_until_idle`` (max_batch N);
    * ``engine, staggered``: one request submitted every ``--stagger`` engine steps, so requests
      join and leave a batch that is mid-decode (continuous batching's case).

    Tokens/s is N·T over the wall time of the whole side (prefills, detokenizing and stop-string
    checks included on the engine's sides). Sides run interleaved, ``--repeats`` times, medians
    reported (a burst of load from other processes falls on every side). The greedy tokens of
    both engine sides are checked equal to generate's.

Run: ``.venv/bin/python benchmarks/serving_batch.py [--requests 16 --tokens 64 --hidden 64
--layers 2 --repeats 3 --stagger 4 --threads 1 --device cpu]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import format_table  # noqa: E402
from grpo_core.io.model_loading import load_tokenizer  # noqa: E402
from grpo_core.io.tiny_models import build_tiny_model  # noqa: E402
from grpo_core.serving.engine import ServingEngine  # noqa: E402
from grpo_core.serving.requests import GenerationRequest, sampling_params  # noqa: E402

TOPICS = ["the sum of two and three", "a cat and a dog", "what is 7+8", "yes or no", "hello world",
          "the final answer", "one two three four five six", "think about it first"]


def conversations(n: int) -> list[list[dict]]:
    """N chats of different lengths (1 to 4 repeats of a topic)."""
    return [[{"role": "user", "content": " ".join([f"Please reply about {TOPICS[i % len(TOPICS)]}."]
                                                  * (1 + i % 4))}] for i in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stagger", type=int, default=4, help="engine steps between staggered arrivals")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu (the figures in BENCHMARKS.md) or cuda")
    args = parser.parse_args()
    # One thread by default: on the shared 2-vCPU machine, OpenMP threads waiting on each other
    # made a tiny model's every matmul ~20x slower (a busy neighbour holds the other core).
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        folder = build_tiny_model(Path(scratch), hidden_size=args.hidden, num_layers=args.layers, seed=1)
        tokenizer = load_tokenizer(str(folder))
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder).eval().to(args.device)
    chats = conversations(args.requests)
    prompts = [tokenizer(tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"] for c in chats]
    params = sampling_params(default_max_tokens=args.tokens, max_tokens_limit=args.tokens, temperature=0)
    requests = [GenerationRequest(params, messages=c) for c in chats]
    never = [len(tokenizer) + 7]  # no sampled token is an EOS: every request makes exactly T tokens
    total = args.requests * args.tokens

    def one_by_one() -> list[list[int]]:
        out = []
        with torch.inference_mode():
            for ids in prompts:
                mask = torch.ones(1, len(ids), dtype=torch.long, device=args.device)
                tokens = model.generate(torch.tensor([ids], device=args.device), attention_mask=mask,
                                        max_new_tokens=args.tokens, do_sample=False, eos_token_id=[],
                                        pad_token_id=tokenizer.pad_token_id)
                out.append(tokens[0, len(ids):].tolist())
        return out

    def all_at_once() -> list[list[int]]:
        engine = ServingEngine(model, tokenizer, args.device, args.requests, eos_token_ids=never)
        handles = [engine.submit(r) for r in requests]
        engine.run_until_idle()
        return [h.token_ids for h in handles]

    def staggered() -> list[list[int]]:
        engine = ServingEngine(model, tokenizer, args.device, args.requests, eos_token_ids=never)
        handles, pending = [], list(requests)
        steps = 0
        while pending or not engine.idle:
            if pending and steps % args.stagger == 0:
                handles.append(engine.submit(pending.pop(0)))
            engine.step()
            steps += 1
        return [h.token_ids for h in handles]

    sides = {"generate, one by one": one_by_one, "engine, all at once": all_at_once,
             "engine, staggered": staggered}
    for run in sides.values():  # warm-up: first calls pay one-off costs (allocator, kernels)
        run()
    times: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for name, run in sides.items():
            began = time.perf_counter()
            outputs[name] = run()  # token ids as Python lists: the device's work is done
            times[name].append(time.perf_counter() - began)
    reference = outputs["generate, one by one"]
    baseline = total / statistics.median(times["generate, one by one"])
    rows = []
    for name in sides:
        seconds = statistics.median(times[name])
        rows.append([name, args.requests, args.tokens, round(seconds, 3), round(total / seconds, 1),
                     round(total / seconds / baseline, 2), "yes" if outputs[name] == reference else "NO"])
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model: random Llama, hidden {args.hidden}, {args.layers} layers, {parameters / 1e6:.2f}M "
          f"parameters; prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens; torch threads "
          f"{torch.get_num_threads()}; {args.device}; median of {args.repeats}")
    headers = ["side", "requests", "tokens each", "seconds", "tokens/s", "vs generate", "same tokens"]
    print(format_table(headers, rows))
    return 0 if all(row[-1] == "yes" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
