"""Next-token sampling filters, in the order Hugging Face applies them: repetition penalty,
temperature, top-k, top-p, min-p.

Pure functions over ``logits (N, V)`` so the generation loop stays short and each filter has a
unit test against a hand-computed case and transformers' own processor.

They shape only which token is *sampled*. The log-probs the loss uses are those of the raw
temperature-scaled logits (:mod:`grpo_core.algorithm.logprobs`), as TRL computes them: TRL (with vLLM or
``generate``) applies top-k/top-p/min-p and the repetition penalty to sampling alone.
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


def apply_min_p(logits: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the row's largest; None or 0
    disables. The most likely token always passes, so a row is never left with nothing."""
    if not min_p:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """Make tokens already seen less likely (CTRL's rule, as transformers applies it): where
    ``seen (N, V)`` is true a positive logit is divided by ``penalty``, a negative one multiplied.
    1 (or no ``seen``) leaves the logits alone."""
    if penalty == 1.0 or seen is None:
        return logits
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(N, V)`` bool: which tokens occur among the real (mask 1) ``ids (N, L)`` of each row.
    Padding is left out: vLLM penalizes a prompt's tokens, and an unpadded row in transformers
    is the same; padding is an artifact of batching, not part of the text."""
    seen = torch.zeros(ids.size(0), vocab_size, dtype=torch.int8, device=ids.device)
    # The largest wins where several positions hold one token: a padded position (0) never
    # clears a token a real position (1) set.
    return seen.scatter_reduce_(1, ids, mask.to(torch.int8), reduce="amax").bool()


def next_token_scores(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits (N, V)`` → the float32 scores whose softmax is the sampling distribution (filtered
    tokens at -inf), in transformers' order. ``seen (N, V)``: the tokens each row's prompt and
    completion hold so far, for ``repetition_penalty``."""
    scores = apply_repetition_penalty(logits.float(), seen, repetition_penalty)
    # At temperature 1 no division: it would copy (N, V) floats every decode step for nothing.
    scores = scores if temperature == 1.0 else scores / temperature
    return apply_min_p(apply_top_p(apply_top_k(scores, top_k), top_p), min_p)


def sample_next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    uniforms: torch.Tensor | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits (N, V)`` → ``(N,)`` token ids; sampling reads row ``i``'s draw from
    ``uniforms (N,)`` in [0, 1) (see ``grpo_core.algorithm.randomness``), greedy needs none. Greedy takes the
    argmax after the repetition penalty only, as transformers does."""
    if greedy:
        return apply_repetition_penalty(logits, seen, repetition_penalty).argmax(dim=-1)
    if uniforms is None or uniforms.shape != logits.shape[:1]:
        raise ValueError("sampling needs one uniform per row")
    scores = next_token_scores(logits, temperature, top_k, top_p, min_p, repetition_penalty, seen)
    # Inverse-CDF sampling: one uniform per row instead of one random number per vocabulary
    # entry (multinomial, Gumbel), which is ~10x cheaper for a decode step on CPU, and which lets
    # the caller key each row's draw.
    return inverse_cdf(scores.softmax(dim=-1), uniforms)


# Vocabulary entries per block of the two-level inverse CDF: V = 32k gives 250 blocks.
CDF_BLOCK = 128
# Up to this many entries one fp64 cumsum is cheaper than the two levels' ~20 small ops (measured
# on CPU: 0.18 vs 0.43 ms for 32 rows of 466 entries, even at ~1.5k; 0.8 vs 0.6 ms at 2k).
ONE_LEVEL_MAX_VOCAB = 1024


def _first_above(cdf: torch.Tensor, u: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """``(N, 1)`` first index whose ``cdf`` exceeds ``u``; where rounding leaves none (u within
    an ulp of the total), the last index with ``positive`` mass. The index found never has zero
    mass: its cdf is above u while its predecessor's is not."""
    found = torch.searchsorted(cdf, u, right=True)
    last = cdf.size(-1) - 1 - positive.flip(-1).int().argmax(-1, keepdim=True)
    return torch.where(found >= cdf.size(-1), last, found)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``probs (N, V)``, ``uniforms (N,)`` in [0, 1) → the token where each row's cumulative
    probability first exceeds ``uniform · total``.

    Two levels in fp64: block totals pick the block, a cumsum of that one block picks the token.
    A V-long cumsum per row is sequential work that cost about as much as the LM head itself on
    a 32k vocabulary; block totals are one vectorised reduction. Small vocabularies (up to
    ``ONE_LEVEL_MAX_VOCAB``) take the one long cumsum, which is fewer operations there.
    """
    n, v = probs.shape
    if v <= ONE_LEVEL_MAX_VOCAB:
        cdf = probs.double().cumsum(-1)
        return _first_above(cdf, uniforms.to(cdf).unsqueeze(1) * cdf[:, -1:], probs > 0).squeeze(1)
    pad = (-v) % CDF_BLOCK
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).reshape(n, -1, CDF_BLOCK)
    totals = blocks.sum(-1, dtype=torch.float64)  # (N, V / CDF_BLOCK)
    block_cdf = totals.cumsum(-1)
    u = uniforms.to(block_cdf).unsqueeze(1) * block_cdf[:, -1:]
    block = _first_above(block_cdf, u, totals > 0)  # (N, 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inside = blocks[torch.arange(n, device=probs.device), block.squeeze(1)].double()  # (N, CDF_BLOCK)
    token = _first_above(inside.cumsum(-1), u - before, inside > 0)
    return (block * CDF_BLOCK + token).squeeze(1)
