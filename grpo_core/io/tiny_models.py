"""Build a tiny random-init causal LM and a locally trained tokenizer into a folder.

For tests, the example job and benchmarks: nothing is downloaded. The folder is an ordinary
Hugging Face model folder, loaded through the same path as any real model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
# Added as ordinary tokens so reasoning tags survive decoding with skip_special_tokens.
EXTRA_TOKENS = ["<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
FAMILIES = ("llama", "qwen2", "gpt2")


def _corpus() -> list[str]:
    """A small, fixed corpus: English glue words, digits and arithmetic, so prompts like
    "What is 2+3?" tokenize into a handful of pieces."""
    words = (
        "what is the answer to yes no maybe think about it so then first second because number "
        "sum of and plus minus times add subtract result final equals a an one two three four five "
        "six seven eight nine ten hello world please reply with short long good bad cat dog"
    ).split()
    lines = [" ".join(words[i : i + 8]) for i in range(0, len(words), 3)]
    lines += [f"What is {a}+{b}? The answer is {a + b}." for a in range(10) for b in range(10)]
    lines += [f"{a} * {b} = {a * b}, {a} - {b} = {a - b}" for a in range(12) for b in range(5)]
    return lines


def build_tokenizer(vocab_size: int = 512, corpus: Iterable[str] | None = None):
    """A byte-level BPE tokenizer trained on ``corpus`` (default :func:`_corpus`), as a
    ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus() if corpus is None else corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    tokenizer.add_tokens(EXTRA_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def _config(family: str, vocab: int, hidden: int, layers: int, heads: int, tokenizer):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=1024,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        **ids,
    )
    return LlamaConfig(**common) if family == "llama" else Qwen2Config(**common)


def build_tiny_model(
    output_dir: str | Path,
    family: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    num_labels: int | None = None,
) -> Path:
    """Write a random-init ``family`` model and its tokenizer to ``output_dir``; returns the path.
    With ``num_labels``, a sequence classifier with that many output logits (a reward model)
    instead of a causal LM."""
    # Imported here so that importing this module (test fixtures, the CLI) stays torch-free.
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if family not in FAMILIES:
        raise ValueError(f"unknown family '{family}'; valid: {', '.join(FAMILIES)}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = _config(family, len(tokenizer), hidden_size, num_layers, num_heads, tokenizer)
    torch.manual_seed(seed)
    if num_labels is not None:
        config.num_labels = num_labels
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
