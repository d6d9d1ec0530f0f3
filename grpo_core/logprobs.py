"""Per-token log-probabilities of sampled tokens (GRPO_REFERENCE step 6).

``log p = logit − logsumexp(logits)``, computed a chunk of tokens at a time so the full
``(N, T, V)`` log-softmax is never materialised: for V = 150k and 8k tokens that tensor alone
is 4.9 GB in fp32. Each chunk is upcast to fp32 before the reduction, which keeps bf16 logits
stable (a bf16 logsumexp loses ~3 significant digits).
"""

from __future__ import annotations

import torch

# Elements of one fp32 chunk of logits (~64 MB): small next to model weights, large enough
# that the Python loop is a negligible cost.
CHUNK_ELEMENTS = 16 * 1024 * 1024


def _rows_per_chunk(vocab_size: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``logits (..., V)``, ``index (...)`` → ``(...)`` fp32 log-probs of the indexed tokens.

    Equal to ``log_softmax(logits / temperature).gather(index)`` without its ``(..., V)`` output.
    """
    return selective_log_softmax_and_entropy(logits, index, temperature, with_entropy=False)[0]


def selective_log_softmax_and_entropy(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`selective_log_softmax`, plus the per-token entropy ``(...)`` (no grad: a metric)."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    vocab = logits.size(-1)
    flat_logits = logits.reshape(-1, vocab)
    flat_index = index.reshape(-1)
    step = _rows_per_chunk(vocab)
    logps, entropies = [], []
    for start in range(0, flat_logits.size(0), step):
        chunk = flat_logits[start : start + step].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        lse = torch.logsumexp(chunk, dim=-1)
        picked = chunk.gather(-1, flat_index[start : start + step].unsqueeze(-1)).squeeze(-1)
        logps.append(picked - lse)
        if with_entropy:
            with torch.no_grad():
                probs = torch.softmax(chunk, dim=-1)
                entropies.append(lse - (probs * chunk).sum(-1))
    out_shape = index.shape
    logp = (
        torch.cat(logps).view(out_shape) if logps else flat_logits.new_zeros(out_shape, dtype=torch.float32)
    )
    entropy = torch.cat(entropies).view(out_shape) if with_entropy and entropies else None
    return logp, entropy


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generation uses them, so training and sampling
    score a token at the same position."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(N, T)`` of the last ``T = completion_length`` tokens of ``input_ids (N, P+T)``.

    Only the ``T`` positions that predict completion tokens go through the LM head
    (``logits_to_keep``), which is most of the memory saving on large vocabularies.
    """
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=completion_length + 1,
        use_cache=False,
    )
    # Position t predicts token t+1: drop the last position's logits.
    logits = outputs.logits[:, :-1, :]
    targets = input_ids[:, -completion_length:]
    return selective_log_softmax_and_entropy(logits, targets, temperature, with_entropy)
