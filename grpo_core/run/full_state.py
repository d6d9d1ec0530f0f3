"""A sharded (fsdp) model's whole state in the non-distributed checkpoint format: gathered to rank
0 for a checkpoint across hosts, and set back into a sharded model from such a checkpoint (or a
ddp one: the format is the same).

The format is the one a single process writes: the trainable weights as the Hugging Face export
and ``optimizer.pt`` as ``optimizer.state_dict()`` gives it, parameters numbered in the order of
the optimizer's groups. ``torch.distributed.checkpoint.state_dict`` names them by their module
paths instead; this module converts between the two, so the file loads into a plain optimizer
(one process, ddp) as well as into a sharded one, on any number of ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from grpo_core.io.model_loading import PolicyAndReference

OPTIMIZER_FILE = "optimizer.pt"


def _options(**options: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Frozen parameters (a LoRA base) come from the model source, as with the adapter export.
    return StateDictOptions(ignore_frozen_params=True, full_state_dict=True, **options)


def gathered_state(
    models: PolicyAndReference, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The full trainable weights (by name) and optimizer state (numbered as
    ``optimizer.state_dict()`` numbers it), in CPU memory on rank 0; empty dicts elsewhere. A
    collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(models.policy, optimizer, options=_options(cpu_offload=True))
    if not weights:
        return {}, {}
    numbers = {name: number for number, name in enumerate(_parameter_names(models.policy, optimizer))}
    return weights, _renamed(optim, numbers)


def load_full_state(folder: Path, models: PolicyAndReference, optimizer: torch.optim.Optimizer) -> None:
    """Set the sharded policy and optimizer from ``folder``'s weights and ``optimizer.pt``, which
    every rank reads whole (each host holds the whole checkpoint) and keeps its shards of."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    names = _parameter_names(models.policy, optimizer)
    optim = _renamed(torch.load(folder / OPTIMIZER_FILE, map_location="cpu", weights_only=False),
                     dict(enumerate(names)))
    weights = _trainable_weights(folder, models)
    missing, unexpected = set_state_dict(models.policy, optimizer, model_state_dict=weights,
                                         optim_state_dict=optim, options=_options(strict=False))
    tied = set(getattr(models.policy, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and k in set(names)]
    if unexpected or missing:
        raise RuntimeError(
            f"checkpoint {folder} does not match the model: missing={missing} unexpected={unexpected}"
        )


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Each parameter the optimizer holds, by its name in ``model``, in the order
    ``optimizer.state_dict()`` numbers them (group by group)."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _renamed(optim: dict[str, Any], new_key: dict[Any, Any]) -> dict[str, Any]:
    """``optim`` with its parameters' keys (numbers or names) replaced by ``new_key``'s."""
    groups = [{**group, "params": [new_key[p] for p in group["params"]]} for group in optim["param_groups"]]
    return {"state": {new_key[k]: v for k, v in optim["state"].items()}, "param_groups": groups}


def _trainable_weights(folder: Path, models: PolicyAndReference) -> dict[str, torch.Tensor]:
    """The export's tensors under the names of the model's own parameters: the Hugging Face
    folder names them as the model does, a peft adapter without its adapter's name (peft's own
    renaming, applied to the model's names, says which is which)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    if not models.uses_adapters:
        return tensors
    from peft import get_peft_model_state_dict

    trainable = [name for name, p in models.policy.named_parameters() if p.requires_grad]
    markers = {name: torch.empty(0) for name in trainable}
    model_name = {id(marker): name for name, marker in markers.items()}
    exported = get_peft_model_state_dict(models.policy, state_dict=markers)
    return {model_name[id(marker)]: tensors[file_name] for file_name, marker in exported.items()}
