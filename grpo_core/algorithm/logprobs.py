"""Per-token log-probabilities of sampled tokens (docs/grpo_reference.md, step 6).

``log p = logit − logsumexp(logits)``, computed a chunk of tokens at a time so the full
``(N, T, V)`` log-softmax is never materialised: for V = 150k and 8k tokens that tensor alone
is 4.9 GB in fp32. Each chunk is upcast to fp32 before the reduction, which keeps bf16 logits
stable (a bf16 logsumexp loses ~3 significant digits).

Precision: the vocabulary-sized work stays fp32, but the ``V`` exponentials are added by torch's
``sum`` (a cascade of partial sums, whose error grows like ``log V``) and the few per-token
values (max, sum, picked logit) are combined in fp64. The CPU ``torch.log_softmax`` adds them
in one running fp32 total per vector lane instead: on LM-like logits at V = 152k-256k it is
1.7e-5-2.8e-5 from an fp64 reference, and the entropy 4e-5-1.2e-4; here both are under 1e-6
there, about the fp32 rounding of the result itself.
"""

from __future__ import annotations

import torch

# Elements of one fp32 chunk of logits (~16 MB): a chunk is read several times (max, shift, exp,
# sum, gather; softmax and scatter in backward), so it should stay near the CPU's caches;
# measured at V = 32k, 64-256 tokens per chunk ran ~2x faster than 512 (64 MB). Smaller chunks
# (1M elements) were no faster on one thread and slower on two: every pass is a parallel region
# whose threads must all be scheduled, and there are more of them.
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

    Every chunk works in these instead of temporaries of its own, so the forward's extra memory is
    just them: 16 MiB each at the default chunk size (the per-chunk temporaries of the fused
    ``log_softmax`` version peaked at 78-109 MiB; BENCHMARKS.md §2).
    """
    first = next(_chunks(logits), None)  # None: no tokens at all
    size = 0 if first is None else logits[first].numel()
    return [torch.empty(size, dtype=torch.float32, device=logits.device) for _ in range(count)]


def _scratch(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The first ``like.numel()`` elements of a flat work ``buffer``, shaped like ``like``."""
    return buffer[: like.numel()].view(like.shape)


def _exp_sums(
    y: torch.Tensor, buffers: list[torch.Tensor], with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``y (n, t, V)`` fp32 scratch → fp32 ``(n, t)`` ``Σ exp(y)`` and, for the entropy, ``Σ exp(y)·y``.

    Without the entropy ``y`` is exponentiated in place; with it (which needs ``y`` too) the
    exponentials go to the last buffer. Either way the same kernel gives the same bits, so the
    log-probs do not depend on whether the entropy was asked for. torch's ``sum`` adds them as a
    cascade of partial sums, whose rounding error grows like ``log V``.
    """
    exps = torch.exp(y, out=_scratch(buffers[-1], y)) if with_entropy else y.exp_()
    total = exps.sum(-1)
    return total, exps.mul_(y).sum(-1) if with_entropy else None


def _finish(
    picked: torch.Tensor, total: torch.Tensor, weighted: torch.Tensor | None, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``picked / T − log s`` and entropies ``log s − Σ exp(y)·y / s``, in fp64, from
    ``picked`` (the picked logit minus the shift, fp64) and the fp32 sums of :func:`_exp_sums`."""
    log_total = total.double().log()
    logp = (picked / temperature - log_total).float()
    if weighted is None:
        return logp, None
    return logp, (log_total - weighted.double() / total.double()).float()


def _chunk_logprobs_and_entropy(
    chunk: torch.Tensor,
    index: torch.Tensor,
    temperature: float,
    buffers: list[torch.Tensor],
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``chunk (n, t, V)``, ``index (n, t)`` → fp32 ``(n, t)`` log-probs and entropies (or None).

    ``y = (x − shift) / T``, ``s = Σ exp(y)``: ``log p = y_index − log s``, ``H = log s − Σ exp(y)·y / s``.
    The shift is the row's max, which keeps ``exp`` in range and ``y`` exact near the max.
    Log-probs are computed by these same passes whether or not the entropy is asked for (it only
    reuses the exponentials): the old policy's and the reference's log-probs (no entropy) are then
    the update's bit for bit while the policy has not moved, so the ratio is exactly 1 and the KL
    exactly 0, as TRL's are by construction. An unshifted two-pass sum for log-probs alone (tried
    here before, on the CPU at T = 1) differed from these passes by an ulp.
    """
    picked = chunk.gather(-1, index.unsqueeze(-1)).squeeze(-1).double()
    peak = chunk.amax(-1, keepdim=True).float()
    # Into fp32 scratch, which is also the upcast of a bf16 chunk; x − max is exact near the max.
    y = torch.sub(chunk, peak, out=_scratch(buffers[0], chunk))
    if temperature != 1.0:
        y.div_(temperature)
    total, weighted = _exp_sums(y, buffers, with_entropy)
    return _finish(picked - peak.squeeze(-1).double(), total, weighted, temperature)


class _SelectiveLogSoftmax(torch.autograd.Function):
    """Chunked log-softmax + gather (and, on request, entropy) with a chunked backward.

    Each chunk's vocabulary-sized work is a few fp32 passes (max, shift, exp, sum) through work
    buffers allocated once; the entropy, a metric, reuses that chunk's exponentials instead of a
    second pass over the logits. Autograd through per-chunk slices would give every chunk a
    zero-filled gradient the size of the whole logits (74 × 4.6 GB at V = 150k); here backward
    writes each chunk's gradient ``(onehot − softmax) · grad`` straight into one output tensor.
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
                logits[rows, times], index[rows, times], temperature, buffers, with_entropy
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
