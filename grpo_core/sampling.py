"""Next-token sampling filters, in the order Hugging Face applies them: temperature, top-k, top-p.

Pure functions over ``logits (N, V)`` so the generation loop stays short and each filter has a
unit test against a hand-computed case.
"""

from __future__ import annotations

import torch


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits per row (ties at the threshold kept); 0 disables."""
    if top_k <= 0 or top_k >= logits.size(-1):
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of tokens whose probability reaches ``top_p``.

    The most likely token is always kept, so a row is never left with nothing to sample.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # Drop a token when the mass *before* it already reaches top_p.
    drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits (N, V)`` → ``(N,)`` token ids; sampling reads row ``i``'s draw from
    ``uniforms (N,)`` in [0, 1) (see ``grpo_core.randomness``), greedy needs none."""
    if greedy:
        return logits.argmax(dim=-1)
    if uniforms is None or uniforms.shape != logits.shape[:1]:
        raise ValueError("sampling needs one uniform per row")
    scores = logits.float() / temperature
    scores = apply_top_p(apply_top_k(scores, top_k), top_p)
    # Inverse-CDF sampling: one uniform per row instead of one random number per vocabulary
    # entry (multinomial, Gumbel), which is ~10x cheaper for a decode step on CPU, and which lets
    # the caller key each row's draw. fp64 keeps the cumulative sum exact enough; ``right=True``
    # never lands on a zero-probability token.
    cdf = scores.softmax(dim=-1).double().cumsum(dim=-1)
    u = uniforms.to(cdf).unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.size(-1) - 1)
