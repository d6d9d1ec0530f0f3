"""The sampling loop's decoder when each prompt is sampled G times: one prefill and one KV cache
per distinct prompt, shared by its G rows.

:class:`~grpo_core.algorithm.decoders.LeanDecoder` prefills all B·G rows and keeps B·G copies of
every prompt's keys and values; each decode step then reads every copy (and, with grouped-query
attention, first expands it to every query head). Here the B prompts are prefilled once and their
caches kept once; each row's cache holds only its own completion. A decode step's attention is
split in two and joined by one softmax over both parts:

* against the prompt: the active rows' queries are laid out by group, ``(U, W, heads)`` (U
  distinct prompts still decoding, W rows per group at most), so one batched matmul per part
  reads each prompt's keys and values once for all of its rows, and grouped-query heads share
  their key head by layout instead of by copy;
* against the row's own completion so far: a plain batched matmul.

The logits agree with the lean decoder's to float rounding (the softmax is one call over both
parts; the attention kernel's is one over the whole row), so the tokens sampled are the same.
Rows leave as they finish, as in the lean decoder; a group none of whose rows decodes any more
leaves the prompt cache.
"""

from __future__ import annotations

import torch

from grpo_core.algorithm.decoders import (
    Decoder,
    LeanDecoder,
    RowCache,
    decoder_for,
    lean_decoder_supports,
    project,
    unwrapped_causal_lm,
)


class SharedPromptDecoder(LeanDecoder):
    """A :class:`LeanDecoder` for batches whose rows come in runs of ``group`` equal prompts."""

    def __init__(self, causal_lm: torch.nn.Module, max_new_tokens: int, group: int):
        super().__init__(causal_lm, max_new_tokens)
        self.group = group
        self.sharing = False  # False while the distinct prompts are prefilled (the lean path)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        g = self.group
        logits = super().prefill(ids[::g], mask[::g])  # (U, V): each prompt's first-token logits
        width, n = self.length, ids.size(0)
        self.prompt_keys = [k[:, :, :width] for k in self.keys]
        self.prompt_values = [v[:, :, :width] for v in self.values]
        self.prompt_valid = self.key_valid[:, :width]
        self.keys = [k.new_empty(n, k.size(1), self.max_new_tokens, k.size(3)) for k in self.prompt_keys]
        self.values = [v.new_empty(n, v.size(1), self.max_new_tokens, v.size(3)) for v in self.prompt_values]
        self.next_position = self.next_position.repeat_interleave(g, dim=0)
        self._place(torch.arange(n, device=ids.device) // g)
        self.length, self.sharing = 0, True
        return logits.repeat_interleave(g, dim=0)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        hidden = self.inner.embed_tokens(token.unsqueeze(1))
        hidden = self._layers(hidden, self.next_position, None, start=self.length)
        self.length += 1
        self.next_position = self.next_position + 1
        return self._logits(hidden)

    def keep(self, rows: torch.Tensor) -> bool:
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.next_position = self.next_position[rows]
        owner = self.owner[rows]
        live, owner = torch.unique_consecutive(owner, return_inverse=True)
        if live.numel() < self.prompt_valid.size(0):  # a whole group finished: its prompt leaves
            self.prompt_keys = [k.index_select(0, live) for k in self.prompt_keys]
            self.prompt_values = [v.index_select(0, live) for v in self.prompt_values]
            self.prompt_valid = self.prompt_valid.index_select(0, live)
        self._place(owner)
        return True

    def keep_caches(self, rows: int) -> None:
        raise NotImplementedError("an episode's turns decode one row per prompt: use LeanDecoder")

    def caches(self) -> dict[int, RowCache]:
        raise NotImplementedError("an episode's turns decode one row per prompt: use LeanDecoder")

    def _place(self, owner: torch.Tensor) -> None:
        """Each active row's group (``owner``, non-decreasing) and place in it (``slot``)."""
        n = owner.numel()
        index = torch.arange(n, device=owner.device)
        starts = torch.ones(n, dtype=torch.bool, device=owner.device)
        starts[1:] = owner[1:] != owner[:-1]
        first = torch.cummax(torch.where(starts, index, 0), dim=0).values
        self.owner, self.slot = owner, index - first
        self.width = int(self.slot.max()) + 1
        # (n, 1, 1, P): where each row's prompt has a token, broadcast over heads and query heads.
        self.prompt_attend = self.prompt_valid.index_select(0, owner)[:, None, None, :]

    def _attention(self, attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   attend: torch.Tensor | None, start: int, index: int) -> torch.Tensor:
        if not self.sharing:
            return super()._attention(attn, x, cos, sin, attend, start, index)
        n = x.size(0)
        query, key, value = project(attn, x, cos, sin, self.head_dim)
        self.keys[index][:, :, start] = key[:, :, 0]
        self.values[index][:, :, start] = value[:, :, 0]
        own_keys, own_values = self.keys[index][:, :, : start + 1], self.values[index][:, :, : start + 1]
        kv_heads = own_keys.size(1)
        # (n, Hkv, groups, D): query head h reads key head h // groups, as repeat_kv lays them out.
        query = query.reshape(n, kv_heads, self.kv_groups, self.head_dim) * attn.scaling
        on_prompt = self._by_group(query) @ self.prompt_keys[index].transpose(-1, -2)
        on_prompt = self._by_row(on_prompt).masked_fill(~self.prompt_attend, float("-inf"))
        on_own = query @ own_keys.transpose(-1, -2)  # (n, Hkv, groups, t): every key is a token
        weights = torch.cat([on_prompt, on_own], dim=-1).softmax(dim=-1)
        prompt_width = on_prompt.size(-1)
        from_prompt = self._by_row(self._by_group(weights[..., :prompt_width]) @ self.prompt_values[index])
        out = from_prompt + weights[..., prompt_width:] @ own_values
        return attn.o_proj(out.reshape(n, 1, -1))

    def _by_group(self, rows: torch.Tensor) -> torch.Tensor:
        """``(n, Hkv, groups, X)`` per active row → ``(U, Hkv, W·groups, X)``: each group's rows
        side by side (empty places zero), ready for one matmul with the group's prompt."""
        n, kv_heads, groups, last = rows.shape
        grid = rows.new_zeros(self.prompt_valid.size(0), self.width, kv_heads, groups, last)
        grid[self.owner, self.slot] = rows
        return grid.permute(0, 2, 1, 3, 4).reshape(grid.size(0), kv_heads, self.width * groups, last)

    def _by_row(self, grouped: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`_by_group`: ``(U, Hkv, W·groups, X)`` → ``(n, Hkv, groups, X)``."""
        u, kv_heads, _, last = grouped.shape
        grid = grouped.view(u, kv_heads, self.width, self.kv_groups, last).permute(0, 2, 1, 3, 4)
        return grid[self.owner, self.slot]


def decoder_for_groups(model: torch.nn.Module, max_new_tokens: int, group: int) -> Decoder:
    """The decoder for a batch whose rows come in runs of ``group`` equal prompts: shared prompt
    caches where the lean decoder applies and a prompt has several rows, else :func:`decoder_for`."""
    causal_lm = unwrapped_causal_lm(model)
    if group > 1 and lean_decoder_supports(causal_lm):
        return SharedPromptDecoder(causal_lm, max_new_tokens, group)
    return decoder_for(model, max_new_tokens)
