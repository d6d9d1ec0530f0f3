"""``resources.sharding: fsdp``: the run's models sharded with FSDP2 across the data-parallel ranks,
and the three places where a sharded model must be handled differently from a replicated one.

FSDP2 (``torch.distributed.fsdp.fully_shard``) splits every parameter along dim 0 over the ranks
(over each host's ranks, replicated across hosts, when they span equal hosts: :func:`device_mesh`);
each decoder layer is one unit (its parameters are all-gathered just before its forward and freed
after), the root holds the rest (embeddings, final norm, LM head). Gradients arrive already
reduce-scattered, so the optimizer, built after sharding, keeps a shard of its state too.

What changes for the rest of the core, and why:

* **Gradient reduction** (:func:`reduce_gradients`): FSDP reduce-scatters in its backward hooks,
  so the data-parallel all-reduce must not run again. Each rank's loss is already its share of
  the whole step's loss (global normalisers), so the reduction is a SUM; FSDP's default would
  average over ranks, hence divide factor 1 and sum-only comms (gloo has no PREMUL_SUM).
* **Gradient norm and clipping** (:func:`clip_gradients`): the gradients are DTensor shards; the
  norm is made whole (``full_tensor``) before anyone reads it, so ``grad_norm`` and the clip
  coefficient equal the unsharded ones.
* **Generation** (:func:`gathered_for_generation`): every forward of a sharded model is a
  collective, but the decode loop runs a data-dependent number of forwards (it stops when the
  rank's own rows have all ended). The whole policy is gathered once before the loop and freed
  after it, so the loop itself has no collectives and ranks may stop at different lengths.
  This costs the full (unsharded) parameters on each device while sampling, which is what
  fits: sharding is for the optimizer state, gradients and activations of training, which are
  several times the parameters. Agreeing a stop across ranks instead would cost a collective
  per token and dummy forwards on ranks whose rows have ended.

Every other forward (reference and old-policy log-probs, the update's micro-batches) runs the
same number of times on every rank: equal row counts and the same accumulation steps. Sampling
rounds must be too (each gathers the policy): extra rounds, as ``drop_zero_std_groups`` takes,
have to be decided for all ranks at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from grpo_core.errors import SpecError
from grpo_core.io.model_loading import PolicyAndReference
from grpo_core.parallel.distributed import Ranks


def shard_models(models: PolicyAndReference, ranks: Ranks) -> None:
    """Shard the policy and, when it is a separate module, the reference in place (over the
    :func:`device_mesh` of the ranks). Call before building the optimizer, which must hold the
    sharded parameters."""
    mesh = device_mesh(ranks)
    _shard(models.policy, mesh)
    if models.reference is not None:
        _shard(models.reference, mesh)


def device_mesh(ranks: Ranks):
    """The ranks' mesh (CPU for gloo, CUDA for NCCL): one dimension over all ranks, or, when they
    span hosts with as many on each, two (hybrid sharding, HSDP): each parameter sharded over
    the ranks of one host and replicated across hosts. Then the all-gathers and reduce-scatters of
    every layer stay on a host's own fast links, and only one all-reduce of each gradient shard
    crosses hosts. Uneven hosts (e.g. 2 + 1 ranks) cannot be a grid: one dimension over all.
    Either way the sums are the same, so the result equals one process's."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = ranks.node_sizes
    if len(sizes) > 1 and len(set(sizes)) == 1:
        # Global ranks follow host order, so row i of the grid is host i's ranks.
        grid = (len(sizes), sizes[0])
        return init_device_mesh(ranks.device.type, grid, mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(ranks.device.type, (ranks.world_size,))


def _shard(model: torch.nn.Module, mesh) -> None:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, found by the class names Hugging Face models declare as
    never to be split (``_no_split_modules``), so any architecture (and a peft wrapper around
    one) is sharded per layer without a table of attribute paths."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise SpecError(
            "resources.sharding",
            f"fsdp shards per decoder layer, but {type(model).__name__} names no layer class "
            "(_no_split_modules); use ddp for this model",
        )
    return layers


def is_sharded(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 (or without distributed) has sharded nothing
        return False
    return isinstance(model, FSDPModule)


def reduce_gradients(model: torch.nn.Module, params: list[torch.nn.Parameter], ranks: Ranks) -> None:
    """Sum the trainable gradients over ranks, unless FSDP already reduce-scattered them."""
    if not is_sharded(model):
        ranks.sum_gradients(params)


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to ``max_norm`` in place; returns the total norm before clipping, over the whole
    (unsharded) gradient whether the gradients are plain tensors or FSDP shards."""
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    # Over DTensor shards the norm is a replicated DTensor: made whole before it is read.
    return float(total.full_tensor() if hasattr(total, "full_tensor") else total)


@contextlib.contextmanager
def gathered_for_generation(model: torch.nn.Module) -> Iterator[None]:
    """Hold ``model``'s full parameters on every rank for the block (the module docstring says
    why); a no-op for a model that is not sharded."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)
