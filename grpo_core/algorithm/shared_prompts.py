"""Each prompt computed once per group in the log-prob passes (reference, old policy, update).

GRPO trains G completions of every prompt, and a plain forward carries the whole prompt through
every one of the G rows: G times the prompt's projections, attention and MLP (and, in the update,
G times their backward) for one prompt's worth of information. With real prompts (a system
prompt, few-shot examples, tool schemas) that is most of a step. Causal attention makes the
prompt's hidden states independent of what follows it, so they can be computed once per distinct
prompt and the G completions can attend to them ("prefix sharing"; Prefix Grouper showed it for
GRPO):

* layer by layer, the distinct prompts ``(U, P)`` run through the layer, then the completions
  ``(N, T)``, whose attention reads their own prompt's keys and values (gathered by index, so
  autograd sums the G completions' gradients into the shared prompt positions, exactly the plain
  computation's sum over its G copies);
* the first completion token is predicted by the prompt's last position, computed once too;
* only real completion tokens go through the LM head (padding after a completion's end is never
  scored; its log-prob is left at 0).

The model's own modules run (embedding, norms, projections, MLPs, rotary embedding, LM head), as
in :mod:`grpo_core.algorithm.decoders`, so LoRA adapters and autocast behave as in its forward;
attention is the same ``scaled_dot_product_attention`` call its "sdpa" implementation makes.
Activation checkpointing, when the model has it on, recomputes each layer in the backward as the
model's own checkpointing does.

It applies automatically to the Llama family the lean decoder supports, to a model that is not
FSDP-sharded (a sharded layer gathers its parameters in its own forward, which this does not
call), and to rows whose prompts repeat; everything else takes the model's forward
(:func:`grpo_core.algorithm.logprobs.completion_logprobs`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from grpo_core.algorithm.decoders import lean_decoder_supports, project, repeat_kv, unwrapped_causal_lm
from grpo_core.algorithm.logprobs import (
    completion_logprobs,
    position_ids_from_mask,
    selective_log_softmax_and_entropy,
)
from grpo_core.algorithm.rollout import Rollout
from grpo_core.parallel.sharding import is_sharded


def rollout_logprobs(
    model: torch.nn.Module, rows: Rollout, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) ``(N, T)`` of ``rows``' completion tokens, each distinct prompt
    computed once where the model allows it, through the model's forward otherwise."""
    owner = prompt_owners(rows.prompt_ids, rows.prompt_mask)
    if owner is not None and shares_prompts(model):
        return _shared_prompt_logprobs(unwrapped_causal_lm(model), rows, owner, temperature, with_entropy)
    width = rows.completion_ids.size(1)
    return completion_logprobs(model, rows.input_ids, rows.attention_mask, width, temperature, with_entropy)


def prompt_owners(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor | None:
    """``(N,)``: for each row, the index of its distinct prompt among runs of consecutive equal
    prompts (a GRPO batch holds each prompt's G rows together); None when no two neighbours share
    a prompt, where there is nothing to save."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1) & (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)
    if not bool(same.any()):
        return None
    return torch.cat([same.new_zeros(1, dtype=torch.long), (~same).long().cumsum(0)])


def shares_prompts(model: torch.nn.Module) -> bool:
    """Whether :func:`rollout_logprobs` computes ``model``'s log-probs with shared prompts."""
    causal_lm = unwrapped_causal_lm(model)
    if not lean_decoder_supports(causal_lm) or is_sharded(model):
        return False
    # The attention call here applies no dropout; the model's does while it trains.
    return not (model.training and getattr(causal_lm.config, "attention_dropout", 0.0))


class _Pass:
    """One shared-prompt pass's fixed inputs: rotary tables and attention masks of the prompts
    and the completions, and which prompt each row answers."""

    def __init__(self, causal_lm: torch.nn.Module, rows: Rollout, owner: torch.Tensor, hidden: torch.Tensor):
        inner, config = causal_lm.model, causal_lm.config
        self.owner = owner
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.kv_groups = config.num_attention_heads // config.num_key_value_heads
        firsts = torch.cat([owner.new_zeros(1), (owner[1:] != owner[:-1]).nonzero().flatten() + 1])
        prompt_mask = rows.prompt_mask[firsts]
        # Columns that are padding in every distinct prompt hold nothing any token attends to.
        start = int(prompt_mask.any(dim=0).long().argmax())
        self.prompt_ids = rows.prompt_ids[firsts, start:]
        prompt_valid = prompt_mask[:, start:].bool()
        completion_valid = rows.completion_mask.bool()
        # Positions as the plain forward numbers them over prompt + completion (padding skipped).
        positions = position_ids_from_mask(torch.cat([rows.prompt_mask, rows.completion_mask], dim=1))
        width = rows.prompt_ids.size(1)
        self.prompt_rotary = _rotary(inner, hidden, positions[firsts, start:width])
        self.completion_rotary = _rotary(inner, hidden, positions[:, width:])
        p, t = prompt_valid.size(1), completion_valid.size(1)
        device = prompt_valid.device
        # A padding query attends to itself only: its output is never used, but a query that sees
        # no key gives NaN in some kernels, and NaN would leak into real rows' values.
        causal_p = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        itself_p = torch.eye(p, dtype=torch.bool, device=device)
        self.prompt_attend = ((causal_p & prompt_valid[:, None, :]) | itself_p).unsqueeze(1)
        causal_t = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        own = (causal_t & completion_valid[:, None, :]) | torch.eye(t, dtype=torch.bool, device=device)
        before = prompt_valid[owner][:, None, :].expand(-1, t, -1)
        self.completion_attend = torch.cat([before, own], dim=2).unsqueeze(1)


def _rotary(
    inner: torch.nn.Module, hidden: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own rotary tables at ``positions (n, L)``, as ``(cos, signed sin)`` broadcast
    over heads (the signed sine makes ``rotate_half`` a roll: ``decoders.rotate``)."""
    cos, sin = inner.rotary_emb(hidden, positions)
    half = cos.size(-1) // 2
    return cos.unsqueeze(1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)


def _attended(attn, query, keys, values, attend, groups: int) -> torch.Tensor:
    n, _, length, _ = query.shape
    out = F.scaled_dot_product_attention(query, repeat_kv(keys, groups), repeat_kv(values, groups),
                                         attn_mask=attend, scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(n, length, -1))


def _layer(layer: torch.nn.Module, state: _Pass, prompt: torch.Tensor, completion: torch.Tensor):
    """One decoder layer over the distinct prompts ``(U, P, hidden)`` and the completions
    ``(N, T, hidden)``, each completion attending to its own prompt's keys and values."""
    attn, d, groups = layer.self_attn, state.head_dim, state.kv_groups
    q_p, k_p, v_p = project(attn, layer.input_layernorm(prompt), *state.prompt_rotary, d)
    q_c, k_c, v_c = project(attn, layer.input_layernorm(completion), *state.completion_rotary, d)
    keys = torch.cat([k_p.index_select(0, state.owner), k_c], dim=2)
    values = torch.cat([v_p.index_select(0, state.owner), v_c], dim=2)
    prompt = prompt + _attended(attn, q_p, k_p, v_p, state.prompt_attend, groups)
    completion = completion + _attended(attn, q_c, keys, values, state.completion_attend, groups)
    prompt = prompt + layer.mlp(layer.post_attention_layernorm(prompt))
    completion = completion + layer.mlp(layer.post_attention_layernorm(completion))
    return prompt, completion


def _checkpointing(causal_lm: torch.nn.Module) -> bool:
    # transformers 5 renamed the flag (the old name warns); earlier versions have only the old one.
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(causal_lm), name):
            return bool(getattr(causal_lm, name))
    return False


def _shared_prompt_logprobs(
    causal_lm: torch.nn.Module, rows: Rollout, owner: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    inner = causal_lm.model
    embed = inner.embed_tokens
    completion = embed(rows.completion_ids)
    state = _Pass(causal_lm, rows, owner, completion)
    prompt = embed(state.prompt_ids)
    recompute = torch.is_grad_enabled() and _checkpointing(causal_lm)
    for layer in list(inner.layers)[: causal_lm.config.num_hidden_layers]:
        if recompute:  # activations recomputed in the backward, as the model's checkpointing does
            prompt, completion = checkpoint(_layer, layer, state, prompt, completion, use_reentrant=False)
        else:
            prompt, completion = _layer(layer, state, prompt, completion)
    # Position t predicts token t + 1: the prompt's last position the first completion token.
    predicting = torch.cat([prompt[:, -1:].index_select(0, owner), completion[:, :-1]], dim=1)
    real = rows.completion_mask.bool()
    if bool(real.all()):
        logits = causal_lm.lm_head(inner.norm(predicting))
        return selective_log_softmax_and_entropy(logits, rows.completion_ids, temperature, with_entropy)
    # The padding after a completion's end is never scored: only real positions go through the LM
    # head and the log-softmax, the largest part of a pass on a large vocabulary. GRPO's G rows of a
    # prompt end at very different lengths, so often half the positions are padding.
    logits = causal_lm.lm_head(inner.norm(predicting[real])).unsqueeze(0)
    logp, entropy = selective_log_softmax_and_entropy(
        logits, rows.completion_ids[real].unsqueeze(0), temperature, with_entropy)
    return _at(real, logp[0]), None if entropy is None else _at(real, entropy[0])


def _at(real: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values (K,)`` of the real positions laid out as ``real (N, T)``, zero at the padding
    (which every loss and metric masks out); gradients flow back to ``values``."""
    return values.new_zeros(real.shape).masked_scatter(real, values)
