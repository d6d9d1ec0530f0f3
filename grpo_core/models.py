"""Load the policy, its tokenizer and the frozen reference from a ``ModelSpec``.

Every failure here is a :class:`SpecError` on ``model.source`` raised before training starts; a
source that cannot be reached or is gone is its subclass :class:`SourceUnavailable`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.paths import resolve_under_root
from grpo_core.sources import unreachable
from grpo_core.spec import ModelSpec, split_source

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_location(
    spec: ModelSpec, models_root: Path | None = None, base_dir: Path | None = None
) -> str:
    """``path:`` → a local folder that holds a ``config.json``; ``hf:`` → the hub id (with revision)."""
    scheme, location = split_source(spec.source)
    if scheme == "hf":
        return location
    if scheme == "job":  # the service resolves these to the job's folder first (worker.job_sources)
        raise SpecError("model.source", "'job:' sources name a job of the service; use 'path:' here")
    folder = resolve_under_root(location, models_root, base_dir, field="model.source")
    if not folder.is_dir():
        # The service checked it at submit: missing now, it was moved or its disk is not mounted.
        raise SourceUnavailable("model.source", f"model folder '{folder}' does not exist")
    if not (folder / "config.json").is_file():
        raise SpecError("model.source", f"'{folder}' holds no config.json: not a Hugging Face model folder")
    return str(folder)


def load_tokenizer(location: str):
    """Left-padding tokenizer; a tokenizer without a pad token pads with EOS (as TRL does)."""
    from transformers import AutoTokenizer

    name, revision = _split_revision(location)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision)
    except Exception as exc:  # transformers raises many types here; all mean "no usable tokenizer"
        raise _load_error(f"could not load a tokenizer from '{location}'", exc) from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise SpecError("model.source", "the tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(location: str, dtype: str, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    name, revision = _split_revision(location)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, revision=revision, dtype=DTYPES[dtype])
    except Exception as exc:
        raise _load_error(f"'{location}' does not hold a causal LM", exc) from exc
    return model.to(device)


def _load_error(what: str, exc: Exception) -> SpecError:
    if unreachable(exc):
        return SourceUnavailable("model.source", f"{what}: the source cannot be reached: {exc}")
    return SpecError("model.source", f"{what}: {exc}")


def _split_revision(location: str) -> tuple[str, str | None]:
    name, _, revision = location.partition("@")
    return name, (revision or None)


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


def build_policy_and_reference(
    spec: ModelSpec, location: str, beta: float, device: torch.device, gradient_checkpointing: bool = False
) -> PolicyAndReference:
    policy = load_causal_lm(location, spec.dtype, device)
    _disable_dropout(policy)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable()
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
            "model.lora", "LoRA needs the 'peft' package (pip install 'grpo-service[lora]')"
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
