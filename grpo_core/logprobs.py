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


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``logits (..., V)``, ``index (...)`` → ``(...)`` fp32 log-probs of the indexed tokens.

    Equal to ``log_softmax(logits / temperature).gather(index)`` without its ``(..., V)`` output.
    """
    return selective_log_softmax_and_entropy(logits, index, temperature, with_entropy=False)[0]


def _chunks(logits: torch.Tensor):
    """Yield ``(row_slice, time_slice)`` pieces of ``logits (N, T, V)`` of at most ~CHUNK_ELEMENTS.

    Chunks are cut from the (possibly non-contiguous) view itself, so only one chunk is ever
    copied: flattening a sliced ``logits[:, :-1]`` first would copy the whole tensor.
    """
    n, t, v = logits.shape
    per_chunk = max(1, CHUNK_ELEMENTS // max(1, v))
    if t <= per_chunk:
        rows = max(1, per_chunk // max(1, t))
        for r in range(0, n, rows):
            yield slice(r, r + rows), slice(0, t)
        return
    for r in range(n):
        for start in range(0, t, per_chunk):
            yield slice(r, r + 1), slice(start, start + per_chunk)


class _SelectiveLogSoftmax(torch.autograd.Function):
    """Chunked log-softmax + gather with a chunked backward.

    Autograd through per-chunk slices would give every chunk a zero-filled gradient the size
    of the whole logits (74 × 4.6 GB at V = 150k); here backward writes each chunk's gradient
    ``(onehot − softmax) · grad`` straight into one output tensor.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, index: torch.Tensor, temperature: float) -> torch.Tensor:
        logp = torch.empty(index.shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty(index.shape, dtype=torch.float32, device=logits.device)
        for rows, times in _chunks(logits):
            chunk = logits[rows, times].float() / temperature
            lse[rows, times] = torch.logsumexp(chunk, dim=-1)
            picked = chunk.gather(-1, index[rows, times].unsqueeze(-1)).squeeze(-1)
            logp[rows, times] = picked - lse[rows, times]
        ctx.save_for_backward(logits, index, lse)
        ctx.temperature = temperature
        return logp

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor):
        logits, index, lse = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for rows, times in _chunks(logits):
            g_out = grad_logp[rows, times].float()
            probs = torch.exp(logits[rows, times].float() / ctx.temperature - lse[rows, times].unsqueeze(-1))
            chunk_grad = -probs * g_out.unsqueeze(-1)
            chunk_grad.scatter_add_(-1, index[rows, times].unsqueeze(-1), g_out.unsqueeze(-1))
            grad[rows, times] = (chunk_grad / ctx.temperature).to(logits.dtype)
        return grad, None, None


@torch.no_grad()
def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    entropy = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    for rows, times in _chunks(logits):
        chunk = logits[rows, times].float() / temperature
        lse = torch.logsumexp(chunk, dim=-1)
        entropy[rows, times] = lse - (torch.softmax(chunk, dim=-1) * chunk).sum(-1)
    return entropy


def selective_log_softmax_and_entropy(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`selective_log_softmax`, plus the per-token entropy ``(...)`` (no grad: a metric)."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    shape = index.shape
    # Work on a 3-D view (N, T, V); adding or merging leading dims of a view copies nothing.
    logits3 = logits.reshape(-1, *logits.shape[-2:]) if logits.dim() >= 3 else logits.unsqueeze(0)
    index3 = index.reshape(logits3.shape[:-1])
    logp = _SelectiveLogSoftmax.apply(logits3, index3, float(temperature)).view(shape)
    entropy = _entropy(logits3, temperature).view(shape) if with_entropy else None
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
