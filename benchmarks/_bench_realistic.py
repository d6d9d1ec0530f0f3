"""The ``--preset realistic`` workload of ``core_vs_trl.py``: a ~31M-parameter Qwen2-style model
with a 32k byte-level BPE vocabulary, and the compute floor of one GRPO step on it.

The tokenizer is trained locally on the Python standard library's own sources (nothing is
downloaded) and cached under ``benchmarks/.cache/`` (gitignored), so only the first run pays the
~1 minute of training. The model is random-init, like the tiny preset's: the benchmark measures
the cost of a step, and both trainers see the same weights, prompts and reward.

The floor (``--side floor``) is what one step cannot do without on this model, measured in its own
child with the same thread count and in the same lock-step rotation as the two trainers:

* decode: the B·G prompt rows prefilled, then one token per step for ``max_completion_length``
  steps through the model with its KV cache, argmax, nothing else (no sampling, no EOS check);
* reference forward: one no-grad forward over prompt + completion, LM head on the completion
  positions only (counted when beta != 0);
* forward + backward: the same forward with grad, ``cross_entropy`` on the completion tokens
  (the cheapest loss that reads every logit), backward;
* optimizer step: fused AdamW over the model's parameters.
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path
from typing import Any

from _bench_sides import PROMPTS, StepGate, max_prompt_tokens, workload_prompts
from _common import format_table, median, peak_rss_mb

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
VOCAB_SIZE = 32_000
# Qwen2-style: grouped-query attention (6 query heads, 2 key/value heads), SwiGLU MLP, untied LM head.
REALISTIC = {
    "family": "qwen2",
    "hidden_size": 384,
    "num_layers": 4,
    "num_heads": 6,
    "num_kv_heads": 2,
    "intermediate_size": 1024,
    "max_completion_length": 128,
    "steps": 5,
    "warmup": 1,
    "repeats": 1,
    "learning_rate": 1e-4,
}
BETAS = (0.04, 0.0)
# Bytes of standard-library source the tokenizer is trained on: enough for 32k merges, and a
# bounded training time (~1 minute on 2 cores).
CORPUS_BYTES = 24 * 1024 * 1024
FLOOR_PARTS = ("decode", "ref_forward", "forward_backward", "optimizer")
# The long-prompt preset's document before each question, in tokens of the 32k tokenizer.
DOCUMENT_TOKENS = 500
# Each preset's targets: ours/TRL steps/s at least, ours/floor at most, peak RSS ours/TRL at most.
TARGETS = {"realistic": (2.0, 1.2, 0.5), "long-prompt": (10.0, 0.3, 0.5)}


def stdlib_corpus(limit_bytes: int = CORPUS_BYTES):
    """The standard library's ``.py`` files (tests and site-packages left out), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    taken = 0
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & {"site-packages", "test", "tests", "idle_test"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield text
        taken += len(text)
        if taken >= limit_bytes:
            return


def cached_tokenizer():
    """The 32k tokenizer, trained once and kept in :data:`CACHE_DIR`."""
    from transformers import AutoTokenizer

    from grpo_core.io.tiny_models import CHAT_TEMPLATE, build_tokenizer

    folder = CACHE_DIR / f"stdlib-bpe-{VOCAB_SIZE}"
    if not (folder / "tokenizer.json").exists():
        tokenizer = build_tokenizer(VOCAB_SIZE - 2, stdlib_corpus())  # + <think>, </think>
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def long_prompts() -> list[str]:
    """Each question of the workload after a document: the first :data:`DOCUMENT_TOKENS` tokens of
    one standard-library module (a real prompt's system text, few-shot block or retrieved page),
    a different one per question, so ~512 prompt tokens in all."""
    tokenizer = cached_tokenizer()
    documents = (text for text in stdlib_corpus() if len(text) > 8 * DOCUMENT_TOKENS)
    prompts = []
    for question, text in zip(PROMPTS, documents, strict=False):
        ids = tokenizer(text[: 16 * DOCUMENT_TOKENS], add_special_tokens=False)["input_ids"][:DOCUMENT_TOKENS]
        prompts.append(f"{tokenizer.decode(ids)}\n\nQuestion: {question}")
    return prompts


def build_realistic_model(output_dir: str | Path, seed: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = cached_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=REALISTIC["hidden_size"],
        intermediate_size=REALISTIC["intermediate_size"],
        num_hidden_layers=REALISTIC["num_layers"],
        num_attention_heads=REALISTIC["num_heads"],
        num_key_value_heads=REALISTIC["num_kv_heads"],
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = Path(output_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------------------------
# Child: the compute floor
# ----------------------------------------------------------------------------------------------
def _floor_batch(args: argparse.Namespace, tokenizer: Any):
    """The B·G left-padded prompt rows of one step (the first B prompts, each G times)."""
    import torch

    from grpo_core.algorithm.rollout import tokenize_prompts

    prompts = workload_prompts(args.preset)[: args.prompts_per_step]
    batch = tokenize_prompts(tokenizer, prompts, max_prompt_tokens(args.preset), torch.device("cpu"))
    g = args.num_generations
    return batch.ids.repeat_interleave(g, dim=0), batch.mask.repeat_interleave(g, dim=0)


def _plain_decode(model: Any, ids: Any, mask: Any, new_tokens: int) -> Any:
    """Argmax decode through the model's own forward and cache, every row to the end: the
    decode floor the issue defines (a plain KV-cached decode of the same token counts)."""
    import torch

    from grpo_core.algorithm.decoders import ModelForwardDecoder

    decoder = ModelForwardDecoder(model)
    tokens = [decoder.prefill(ids, mask).argmax(-1)]
    for _ in range(new_tokens - 1):
        tokens.append(decoder.step(tokens[-1]).argmax(-1))
    return torch.stack(tokens, dim=1)


def side_floor(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.algorithm.logprobs import position_ids_from_mask

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, fused=True)
    prompt_ids, prompt_mask = _floor_batch(args, tokenizer)
    t = args.max_completion_length
    gate = StepGate(args.sync_fds)
    parts: dict[str, list[float]] = {name: [] for name in FLOOR_PARTS}
    for _ in range(args.warmup + args.steps):
        gate.wait()
        clock = time.perf_counter()
        model.eval()
        with torch.no_grad():
            completion = _plain_decode(model, prompt_ids, prompt_mask, t)
        ids = torch.cat([prompt_ids, completion], dim=1)
        mask = torch.cat([prompt_mask, torch.ones_like(completion)], dim=1)
        inputs = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "logits_to_keep": torch.arange(ids.size(1) - t - 1, ids.size(1) - 1),
            "use_cache": False,
        }
        parts["decode"].append(time.perf_counter() - clock)
        clock = time.perf_counter()
        with torch.no_grad():
            model(**inputs)
        parts["ref_forward"].append(time.perf_counter() - clock)
        clock = time.perf_counter()
        model.train()
        logits = model(**inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), completion.reshape(-1))
        loss.backward()
        parts["forward_backward"].append(time.perf_counter() - clock)
        clock = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        parts["optimizer"].append(time.perf_counter() - clock)
        gate.done()
    gate.wait()  # final barrier
    return {"side": "floor", "parts": parts, "peak_rss_mb": peak_rss_mb(), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------------------------
# Parent: the preset's summary
# ----------------------------------------------------------------------------------------------
def floor_seconds(floor: dict[str, Any], warmup: int, beta: float) -> dict[str, float]:
    """Median seconds of each floor part over the measured steps, and their ``total`` for ``beta``."""
    parts = {name: median(values[warmup:]) for name, values in floor["parts"].items()}
    counted = [name for name in FLOOR_PARTS if beta != 0.0 or name != "ref_forward"]
    return parts | {"total": sum(parts[name] for name in counted)}


def render_realistic(
    results: list[dict[str, Any]], floor: dict[str, float], targets: tuple[float, float, float]
) -> str:
    """One line per beta: ours vs TRL vs the floor, with the targets' ratios."""
    speed, below_floor, memory = targets
    rows = []
    for item in results:
        core, trl_, verdict = item["summary"]["core"], item["summary"]["trl"], item["verdict"]
        step_floor = item["floor_s"]
        rows.append(
            [
                item["beta"],
                core["median_step_s"],
                trl_["median_step_s"],
                step_floor,
                f"{verdict['speed_ratio_all_steps']:.2f}x",
                f"{verdict['speed_ratio_paired']:.2f}x",
                f"{core['median_step_s'] / step_floor:.2f}x",
                f"{core['peak_rss_mb']:,.0f} / {trl_['peak_rss_mb']:,.0f}",
                f"{verdict['memory_ratio']:.2f}",
                f"{core['final_reward']:.3f} / {trl_['final_reward']:.3f}",
            ]
        )
    table = format_table(
        [
            "beta",
            "ours s/step",
            "TRL s/step",
            "floor s/step",
            "ours/TRL steps/s",
            "paired",
            "ours/floor",
            "peak RSS MiB ours / TRL",
            "RSS ratio",
            "final reward ours / TRL",
        ],
        rows,
    )
    parts = ", ".join(f"{name} {floor[name]:.3f} s" for name in FLOOR_PARTS)
    return "\n".join(
        [
            f"Summary (medians of the measured steps; targets: ours/TRL >= {speed}x, "
            f"ours/floor <= {below_floor}x, RSS ratio <= {memory}):",
            table,
            f"Floor parts (median per step): {parts}; beta 0 leaves out the reference forward.",
        ]
    )
