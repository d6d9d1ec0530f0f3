"""Per-token log-probabilities of sampled tokens (GRPO_REFERENCE step 6).

``log p = logit − logsumexp(logits)``, computed a chunk of tokens at a time so the full
``(N, T, V)`` log-softmax is never materialised: for V = 150k and 8k tokens that tensor alone
is 4.9 GB in fp32. Each chunk is upcast to fp32 before the reduction, which keeps bf16 logits
stable (a bf16 logsumexp loses ~3 significant digits).

Precision: the vocabulary-sized work stays fp32, but the sum of the ``V`` exponentials is
torch's pairwise ``sum`` and the few per-token values (max, sum, picked logit) are combined in
fp64. ``torch.log_softmax`` instead keeps one running fp32 total per vector lane, whose error
grows with ``V``: 1.8e-5 from an fp64 reference at V = 152k, against ~1e-6 here (about the fp32
rounding of the result itself), and 1e-4 against ~1e-6 for the entropy.
"""

from __future__ import annotations

import torch

# Elements of one fp32 chunk of logits (~16 MB): a chunk is read several times (log-softmax,
# gather, entropy; softmax and scatter in backward), so it should stay near the CPU's caches;
# measured at V = 32k, 64-256 tokens per chunk ran ~2x faster than 512 (64 MB) and the
# per-chunk Python cost is still negligible.
CHUNK_ELEMENTS = 4 * 1024 * 1024


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


def _scaled_fp32(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    """``chunk / temperature`` in fp32; no copy at all for fp32 logits at temperature 1."""
    chunk = chunk if chunk.dtype == torch.float32 else chunk.float()
    return chunk if temperature == 1.0 else chunk / temperature


def _chunk_buffers(logits: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``count`` flat fp32 work buffers the size of the largest (the first) chunk.

    Reused by every chunk: a fresh chunk-sized tensor is a new ``mmap`` whose pages are faulted
    in and zeroed on first touch, as costly as one of the passes over the chunk.
    """
    first = next(_chunks(logits), None)  # None: no tokens at all
    size = 0 if first is None else logits[first].numel()
    return [torch.empty(size, dtype=torch.float32, device=logits.device) for _ in range(count)]


def _chunk_logprobs_and_entropy(
    chunk: torch.Tensor, index: torch.Tensor, temperature: float, buffers: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``chunk (n, t, V)``, ``index (n, t)`` → fp32 ``(n, t)`` log-probs and, given two
    ``buffers``, entropies (None with one).

    With ``y = (x − max) / T`` and ``s = Σ exp(y)``: ``log p = y_index − log s`` and
    ``H = log s − Σ exp(y)·y / s``. The picked logit and the max are subtracted in fp64, exactly.
    """
    peak = chunk.amax(-1, keepdim=True).float()
    # Writing the shift into an fp32 buffer is also the upcast of a bf16 chunk.
    shifted = torch.sub(chunk, peak, out=buffers[0][: chunk.numel()].view(chunk.shape))
    if temperature != 1.0:
        shifted.div_(temperature)
    picked = chunk.gather(-1, index.unsqueeze(-1)).squeeze(-1).double()
    if len(buffers) == 1:
        total, weighted = shifted.exp_().sum(-1), None
    else:
        exps = torch.exp(shifted, out=buffers[1][: chunk.numel()].view(chunk.shape))
        total, weighted = exps.sum(-1), shifted.mul_(exps).sum(-1)
    log_total = total.double().log()
    logp = (picked - peak.squeeze(-1).double()) / temperature - log_total
    if weighted is None:
        return logp.float(), None
    return logp.float(), (log_total - weighted.double() / total.double()).float()


class _SelectiveLogSoftmax(torch.autograd.Function):
    """Chunked log-softmax + gather (and, on request, entropy) with a chunked backward.

    Each chunk's vocabulary-sized work is a few fp32 passes (max, shift, exp, sum) through work
    buffers allocated once; the entropy, a metric, reuses that chunk's exponentials instead of a
    second pass over the logits. Autograd
    through per-chunk slices would give every chunk a zero-filled gradient the size of the whole
    logits (74 × 4.6 GB at V = 150k); here backward writes each chunk's gradient
    ``(onehot − softmax) · grad`` straight into one output tensor.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, index: torch.Tensor, temperature: float, with_entropy: bool):
        logp = torch.empty(index.shape, dtype=torch.float32, device=logits.device)
        entropy = (
            torch.empty(index.shape, dtype=torch.float32, device=logits.device) if with_entropy else None
        )
        buffers = _chunk_buffers(logits, 2 if with_entropy else 1)
        for rows, times in _chunks(logits):
            chunk_logp, chunk_entropy = _chunk_logprobs_and_entropy(
                logits[rows, times], index[rows, times], temperature, buffers
            )
            logp[rows, times] = chunk_logp
            if entropy is not None:
                entropy[rows, times] = chunk_entropy
        ctx.save_for_backward(logits, index)
        ctx.temperature = temperature
        if entropy is None:
            return logp, None
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy):
        logits, index = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for rows, times in _chunks(logits):
            g_out = grad_logp[rows, times].float().unsqueeze(-1)
            target = grad[rows, times]  # contiguous: whole rows, or a run of one row's positions
            chunk = _scaled_fp32(logits[rows, times], temperature)
            if target.dtype == torch.float32:
                # The softmax is written straight into the gradient: no chunk-sized temporary.
                probs = torch.ops.aten._softmax.out(chunk, -1, False, out=target)
            else:
                probs = torch.softmax(chunk, dim=-1)
            probs.mul_(-g_out)
            probs.scatter_add_(-1, index[rows, times].unsqueeze(-1), g_out)
            if temperature != 1.0:
                probs.div_(temperature)
            if probs is not target:
                target.copy_(probs)
        return grad, None, None, None


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
    logp, entropy = _SelectiveLogSoftmax.apply(logits3, index3, float(temperature), with_entropy)
    return logp.view(shape), entropy.view(shape) if entropy is not None else None


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
    (``logits_to_keep`` as positions), which is most of the memory saving on large vocabularies;
    the logits come out contiguous, so no chunk of them is ever copied.
    """
    length = input_ids.size(1)
    # Position t predicts token t+1: the positions just before each completion token.
    predicting = torch.arange(length - completion_length - 1, length - 1, device=input_ids.device)
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=predicting,
        use_cache=False,
    )
    targets = input_ids[:, -completion_length:]
    return selective_log_softmax_and_entropy(outputs.logits, targets, temperature, with_entropy)
