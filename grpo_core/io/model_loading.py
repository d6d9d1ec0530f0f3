"""Load the policy, its tokenizer and the frozen reference from a ``ModelSpec``.

Every failure here is a :class:`SpecError` on ``model.source`` raised before training starts; a
source that cannot be reached or is gone is its subclass :class:`SourceUnavailable`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.install_hints import install_hint
from grpo_core.io.hub_loading import is_hub_location, load_from_hub
from grpo_core.io.paths import resolve_under_root
from grpo_core.io.source_errors import unreachable
from grpo_core.spec.run_spec import ModelSpec
from grpo_core.spec.sources import split_source

T = TypeVar("T")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_location(
    spec: ModelSpec, models_root: Path | None = None, base_dir: Path | None = None
) -> str:
    """``path:`` → the absolute path of a local folder that holds a ``config.json``; ``hf:`` → the
    hub id (with revision), never a path (:func:`grpo_core.io.hub_loading.is_hub_location`)."""
    return resolve_source_location(spec.source, models_root, base_dir, "model.source")


def resolve_source_location(source: str, models_root: Path | None, base_dir: Path | None, field: str) -> str:
    """:func:`resolve_model_location` of any field naming a model (a reward's model too)."""
    try:
        scheme, location = split_source(source)
    except ValueError as exc:  # a scheme of whoever built the spec (a service's), left unresolved
        raise SpecError(field, f"{source}: {exc}") from exc
    if scheme == "hf":
        return location
    folder = resolve_under_root(location, models_root, base_dir, field=field)
    if not folder.is_dir():
        # The service checked it at submit: missing now, it was moved or its disk is not mounted.
        raise SourceUnavailable(field, f"model folder '{folder}' does not exist")
    if not (folder / "config.json").is_file():
        raise SpecError(field, f"'{folder}' holds no config.json: not a Hugging Face model folder")
    return str(folder)


def load_pretrained(location: str, what: str, load: Callable[[str, str | None], T], failed: str,
                    field: str = "model.source") -> T:
    """``load(name, revision)`` from a hub id (by id only, see :mod:`grpo_core.io.hub_loading`) or a folder;
    a folder that fails is a SpecError at ``field`` saying ``failed`` and why."""
    if is_hub_location(location):
        return load_from_hub(location, field, what, load)
    try:
        return load(location, None)
    except Exception as exc:  # transformers raises many types here; all mean "not usable"
        raise _load_error(failed, exc, field) from exc


def load_tokenizer(location: str, field: str = "model.source"):
    """Left-padding tokenizer; a tokenizer without a pad token pads with EOS (as TRL does)."""
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(location, "a tokenizer from", lambda name, revision: (
        AutoTokenizer.from_pretrained(name, revision=revision)),
        f"could not load a tokenizer from '{location}'", field)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise SpecError(field, "the tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(location: str, dtype: str, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = load_pretrained(location, "a causal LM from", lambda name, revision: (
        AutoModelForCausalLM.from_pretrained(name, revision=revision, dtype=DTYPES[dtype])),
        f"'{location}' does not hold a causal LM")
    return model.to(device)


def _load_error(what: str, exc: Exception, field: str) -> SpecError:
    if unreachable(exc):
        return SourceUnavailable(field, f"{what}: the source cannot be reached: {exc}")
    return SpecError(field, f"{what}: {exc}")


def quiet_library_progress_bars() -> None:
    """transformers draws a bar for every weight load and checkpoint save: noise in a worker's log
    and beside ``grpo train``'s own bar."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@dataclass
class PolicyAndReference:
    """The trainable policy and a way to run the frozen reference.

    With LoRA the reference is the same module with its adapters disabled, so no second copy
    of the weights exists; with ``beta == 0`` there is no reference at all.
    """

    policy: torch.nn.Module
    reference: torch.nn.Module | None
    uses_adapters: bool

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[torch.nn.Module]:
        if self.uses_adapters:
            with self.policy.disable_adapter():
                yield self.policy
        elif self.reference is not None:
            yield self.reference
        else:
            raise RuntimeError("no reference model: beta is 0")


def _enable_activation_checkpointing(policy: torch.nn.Module) -> None:
    """transformers 5 renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable``
    and the old name warns (FutureWarning) on every call; versions before the rename have only
    the old name, which is silent there."""
    enable = getattr(policy, "activation_checkpointing_enable", None) or policy.gradient_checkpointing_enable
    enable()


def build_policy_and_reference(
    spec: ModelSpec, location: str, beta: float, device: torch.device, gradient_checkpointing: bool = False
) -> PolicyAndReference:
    policy = load_causal_lm(location, spec.dtype, device)
    _disable_dropout(policy)
    if gradient_checkpointing:
        _enable_activation_checkpointing(policy)
        policy.config.use_cache = False
    if spec.lora is not None:
        adapted = _with_lora(policy, spec)
        _disable_dropout(adapted)  # peft adds its own ``lora_dropout`` modules when it wraps
        return PolicyAndReference(adapted, None, uses_adapters=True)
    reference = None
    if beta != 0.0:
        reference = copy.deepcopy(policy).eval()
        reference.requires_grad_(False)
    return PolicyAndReference(policy, reference, uses_adapters=False)


def _disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off, as TRL does by default: with it, the policy's log-probs in the update would
    not match those it sampled with, and the ratio would be noise even on-policy."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _with_lora(policy: torch.nn.Module, spec: ModelSpec) -> torch.nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise SpecError(
            "model.lora", f"LoRA needs the 'peft' package ({install_hint('lora', 'peft')})"
        ) from exc
    lora = spec.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(policy, config)
    except ValueError as exc:
        raise SpecError("model.lora.target_modules", str(exc)) from exc
