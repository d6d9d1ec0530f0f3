"""The forward passes behind the rollout's sampling loop: prefill a left-padded batch, then one
token per step for the rows still generating, dropping rows as they finish.

Two implementations of one small protocol (:class:`Decoder`):

* :class:`LeanDecoder`, for Llama-family models (:func:`lean_decoder_supports`). On small and
  mid-size models a decode step costs less in arithmetic than in the per-call machinery of the
  Hugging Face forward: output dataclasses, keyword plumbing and decorators, a 4-D causal mask
  rebuilt every step, a KV cache grown by ``torch.cat`` (a copy of every layer's cache per
  token), rotary tables recomputed per call. The lean decoder runs the model's *own* modules
  (embedding, norms, projections, MLPs, LM head, rotary embedding), so LoRA adapters, FSDP's
  gathered parameters and autocast behave exactly as in the model's forward, and replaces only
  that orchestration: a cache preallocated for the whole completion and written in place, one
  boolean key mask, one rotary table for every position the batch will reach.
* :class:`ModelForwardDecoder`: the model's own forward with its cache object, for every other
  architecture (and the reference the lean decoder is tested against).

Both compute attention with ``scaled_dot_product_attention`` the way the model's "sdpa"
implementation does, so their logits agree to float rounding.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from grpo_core.algorithm.logprobs import position_ids_from_mask

# Decoder-only families whose layers are ``input_layernorm → self_attn(q/k/v/o_proj, rotary) →
# residual → post_attention_layernorm → mlp → residual`` (Qwen3 adds per-head q/k norms).
LEAN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Rotary types whose frequencies do not change with the sequence length (one table serves all
# steps); "dynamic" and "longrope" rescale as the sequence grows.
_STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


class Decoder(Protocol):
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ``(N, P)`` → logits ``(N, V)`` for each row's first new token."""

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """The active rows' last sampled tokens ``(n,)`` → logits ``(n, V)`` for the next one."""

    def keep(self, rows: torch.Tensor) -> bool:
        """Keep only ``rows`` (indices into the active rows) from now on; False when this decoder
        cannot drop rows (then the caller keeps finished rows and pads their tokens)."""


def decoder_for(model: torch.nn.Module, max_new_tokens: int) -> Decoder:
    causal_lm = unwrapped_causal_lm(model)
    if lean_decoder_supports(causal_lm):
        return LeanDecoder(causal_lm, max_new_tokens)
    return ModelForwardDecoder(model)


def lean_decoder_supports(causal_lm: torch.nn.Module) -> bool:
    """Whether :class:`LeanDecoder` computes exactly what ``causal_lm``'s forward computes."""
    config = getattr(causal_lm, "config", None)
    if config is None or getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return False
    inner = getattr(causal_lm, "model", None)
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if not hasattr(causal_lm, "lm_head"):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False  # flash/flex kernels round differently from the sdpa call made here
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types):
        return False  # sliding-window layers attend to a band, not the whole prefix
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_type", "default") in _STATIC_ROPE_TYPES


def unwrapped_causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """A PEFT model's underlying causal LM (its projections are the adapter-wrapped modules)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


class ModelForwardDecoder:
    """Each step is one call of the model's forward with its returned cache."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        # transformers 5 renamed ``past_key_values`` to ``cache``; accept both generations.
        parameters = inspect.signature(model.forward).parameters
        self.cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        self.cache = None

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.attention = mask
        positions = position_ids_from_mask(mask)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        self.next_position = positions[:, -1:] + 1
        return self._logits(out)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        grown = self.attention.new_ones(self.attention.size(0), 1)
        self.attention = torch.cat([self.attention, grown], dim=1)
        out = self.model(input_ids=token.unsqueeze(1), attention_mask=self.attention,
                         position_ids=self.next_position, use_cache=True, **{self.cache_keyword: self.cache})
        self.next_position = self.next_position + 1
        return self._logits(out)

    def keep(self, rows: torch.Tensor) -> bool:
        if not hasattr(self.cache, "batch_select_indices"):
            return False
        self.cache.batch_select_indices(rows)
        self.attention, self.next_position = self.attention[rows], self.next_position[rows]
        return True

    def _logits(self, out) -> torch.Tensor:
        cache = getattr(out, "cache", None)
        self.cache = cache if cache is not None else out.past_key_values
        return out.logits[:, -1, :]


@dataclass
class RowCache:
    """One row's KV cache as a turn left it: every layer's keys and values of its context so far
    (its last sampled token not yet among them: a row leaves the decode as it samples its end),
    which of their positions hold a token, and the position its next token takes."""

    keys: list[torch.Tensor]  # per layer (heads, L, head_dim)
    values: list[torch.Tensor]
    key_valid: torch.Tensor  # (L,) bool
    next_position: torch.Tensor  # (1,) long

    @property
    def tokens(self) -> int:
        """How many of the row's context tokens the cache holds."""
        return int(self.key_valid.sum())


class LeanDecoder:
    """The model's modules driven with a preallocated KV cache (the module docstring says why).

    Between an episode's turns (:mod:`grpo_core.algorithm.episodes`) each row's cache is kept
    (:meth:`keep_caches`, :meth:`caches`) and the next turn starts from it (:meth:`resume`),
    computing only the tokens the cache does not hold (the last sampled one, the observation)
    instead of the whole context again."""

    def __init__(self, causal_lm: torch.nn.Module, max_new_tokens: int):
        config = causal_lm.config
        self.inner = causal_lm.model
        self.lm_head = causal_lm.lm_head
        self.layers = list(self.inner.layers)[: config.num_hidden_layers]
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.kv_groups = config.num_attention_heads // config.num_key_value_heads
        self.max_new_tokens = max_new_tokens
        self.kept: dict[int, RowCache] | None = None  # with keep_caches: each row's, by batch row
        self.rows: torch.Tensor | None = None  # the batch rows still decoding

    def keep_caches(self, rows: int) -> None:
        """From now on, a row that leaves the decode (and, at :meth:`caches`, every row) keeps its
        cache, by its row in the batch of ``rows``."""
        self.kept = {}
        self.rows = torch.arange(rows)

    def caches(self) -> dict[int, RowCache]:
        """Every row's cache (those still decoding taken now), by batch row."""
        assert self.kept is not None and self.rows is not None
        for index, row in enumerate(self.rows.tolist()):
            self.kept[row] = self._row_cache(index)
        return self.kept

    def _row_cache(self, index: int) -> RowCache:
        return RowCache([k[index, :, : self.length].clone() for k in self.keys],
                        [v[index, :, : self.length].clone() for v in self.values],
                        self.key_valid[index, : self.length].clone(), self.next_position[index].clone())

    def resume(self, caches: list[RowCache], blocks: list[list[int]], device: torch.device) -> torch.Tensor:
        """Start a turn from each row's cache and the tokens of its context the cache lacks
        (``blocks``, each at least one token): logits ``(N, V)`` for each row's next token, as a
        prefill of its whole context gives them (to float rounding)."""
        n, width = len(caches), max(len(block) for block in blocks)
        held = max(cache.keys[0].size(1) for cache in caches)
        total = held + width + self.max_new_tokens
        ids = torch.zeros(n, width, dtype=torch.long, device=device)
        block_valid = torch.zeros(n, width, dtype=torch.bool, device=device)
        self.key_valid = torch.zeros(n, total, dtype=torch.bool, device=device)
        first = caches[0]
        self.keys = [k.new_zeros(n, k.size(0), total, k.size(2)) for k in first.keys]
        self.values = [v.new_zeros(n, v.size(0), total, v.size(2)) for v in first.values]
        for row, (cache, block) in enumerate(zip(caches, blocks, strict=True)):
            length = cache.keys[0].size(1)
            for layer, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True)):
                self.keys[layer][row, :, :length] = k
                self.values[layer][row, :, :length] = v
            self.key_valid[row, :length] = cache.key_valid
            # The block right-aligned: every row's last token at the same place, as a prefill's.
            ids[row, width - len(block):] = torch.tensor(block, dtype=torch.long, device=device)
            block_valid[row, width - len(block):] = True
        starts = torch.stack([cache.next_position for cache in caches]).to(device)  # (n, 1)
        positions = (starts + block_valid.long().cumsum(dim=1) - 1).clamp(min=0)
        self.key_valid[:, held: held + width] = block_valid
        hidden = self.inner.embed_tokens(ids)
        reach = int(positions.max()) + self.max_new_tokens + 1
        cos, sin = self.inner.rotary_emb(hidden, torch.arange(reach, device=device).unsqueeze(0))
        half = cos.size(-1) // 2
        self.cos_table = cos[0]
        self.signed_sin_table = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        itself = torch.eye(width, dtype=torch.bool, device=device)
        within = (causal & block_valid[:, None, :]) | itself
        before = self.key_valid[:, None, :held].expand(n, width, held)
        attend = torch.cat([before, within], dim=2).unsqueeze(1)
        hidden = self._layers(hidden, positions, attend, start=held)
        self.length = held + width
        self.next_position = positions[:, -1:] + 1
        return self._logits(hidden[:, -1:, :])

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, width = ids.shape
        positions = position_ids_from_mask(mask)
        hidden = self.inner.embed_tokens(ids)
        # Every position a row can reach, computed once by the model's own rotary module: the
        # same elementwise formula per position as its per-call tables, so the same values.
        reach = int(positions.max()) + self.max_new_tokens + 1
        cos, sin = self.inner.rotary_emb(hidden, torch.arange(reach, device=ids.device).unsqueeze(0))
        half = cos.size(-1) // 2
        # ``rotate_half(x) * sin`` is ``roll(x, half) * sin`` with sin's first half negated: one
        # op instead of three per rotation, and bitwise the same (negation is exact).
        self.cos_table = cos[0]
        self.signed_sin_table = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        self.key_valid = torch.zeros(n, width + self.max_new_tokens, dtype=torch.bool, device=ids.device)
        self.key_valid[:, :width] = mask.bool()
        causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
        # A padding position attends to itself only: its output is never used, but some attention
        # kernels give NaN for a query that sees no key, and NaN would leak into real rows' values.
        itself = torch.eye(width, dtype=torch.bool, device=ids.device)
        attend = (causal & self.key_valid[:, None, :width]) | itself
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        hidden = self._layers(hidden, positions, attend.unsqueeze(1), start=0)
        self.length = width
        self.next_position = positions[:, -1:] + 1
        return self._logits(hidden[:, -1:, :])

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.key_valid[:, self.length] = True
        hidden = self.inner.embed_tokens(token.unsqueeze(1))
        attend = self.key_valid[:, None, None, : self.length + 1]
        hidden = self._layers(hidden, self.next_position, attend, start=self.length)
        self.length += 1
        self.next_position = self.next_position + 1
        return self._logits(hidden)

    def keep(self, rows: torch.Tensor) -> bool:
        if self.kept is not None and self.rows is not None:  # the rows leaving keep their caches
            leaving = torch.ones(self.rows.numel(), dtype=torch.bool)
            leaving[rows.cpu()] = False
            for index in leaving.nonzero().flatten().tolist():
                self.kept[int(self.rows[index])] = self._row_cache(index)
            self.rows = self.rows[rows.cpu()]
        # index_select, not ``tensor[rows]``: several times faster on a whole preallocated cache.
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_valid, self.next_position = self.key_valid.index_select(0, rows), self.next_position[rows]
        return True

    def _logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.inner.norm(last_hidden))[:, -1, :]

    def _layers(
        self, hidden: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor, start: int
    ) -> torch.Tensor:
        cos = self.cos_table[positions].unsqueeze(1)  # (n, 1, L, D): broadcast over heads
        sin = self.signed_sin_table[positions].unsqueeze(1)
        for index, layer in enumerate(self.layers):
            normed = layer.input_layernorm(hidden)
            hidden = hidden + self._attention(layer.self_attn, normed, cos, sin, attend, start, index)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return hidden

    def _attention(self, attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   attend: torch.Tensor, start: int, index: int) -> torch.Tensor:
        n, length, _ = x.shape
        query, key, value = project(attn, x, cos, sin, self.head_dim)
        if index == len(self.keys):  # prefill: the cache is sized for the whole completion
            total = length + self.max_new_tokens
            self.keys.append(key.new_empty(n, key.size(1), total, self.head_dim))
            self.values.append(value.new_empty(n, value.size(1), total, self.head_dim))
        end = start + length
        self.keys[index][:, :, start:end] = key
        self.values[index][:, :, start:end] = value
        keys = repeat_kv(self.keys[index][:, :, :end], self.kv_groups)
        values = repeat_kv(self.values[index][:, :, :end], self.kv_groups)
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=attend, scale=attn.scaling)
        return attn.o_proj(out.transpose(1, 2).reshape(n, length, -1))


def project(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
            head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x (n, L, hidden)`` through the attention's own projections → rotated queries
    ``(n, H, L, D)``, rotated keys and values ``(n, Hkv, L, D)``, as the model's attention makes them."""
    n, length, _ = x.shape
    heads = (n, length, -1, head_dim)
    query, key = attn.q_proj(x).view(heads), attn.k_proj(x).view(heads)
    if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before the rotation
        query, key = attn.q_norm(query), attn.k_norm(key)
    value = attn.v_proj(x).view(heads).transpose(1, 2)
    return rotate(query.transpose(1, 2), cos, signed_sin), rotate(key.transpose(1, 2), cos, signed_sin), value


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding as the Llama family applies it: ``x·cos + rotate_half(x)·sin``."""
    return x * cos + x.roll(x.size(-1) // 2, dims=-1) * signed_sin


def repeat_kv(kv: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: each key/value head serves ``groups`` query heads."""
    if groups == 1:
        return kv
    n, heads, length, dim = kv.shape
    return kv[:, :, None].expand(n, heads, groups, length, dim).reshape(n, heads * groups, length, dim)
