"""A trained model as its users take it away: a Hugging Face folder that
``AutoModelForCausalLM.from_pretrained`` loads, made from a checkpoint.

A checkpoint's ``step-N/`` already holds the model as Hugging Face saves it (config, safetensors
weights, or the adapter alone with LoRA, and the tokenizer) next to the state that only resuming
needs (optimizer, scheduler, RNG, pending experience, fsdp's ``distributed/``). The model is the
first part plus two files written here: ``generation_config.json`` (the base model's, with the
sampling the job trained with) and ``README.md``, a model card with the Hub's YAML metadata
(``library_name``, ``tags``, ``base_model`` for a hub source), the job's spec, final metrics and
last eval point. A card is meant to be published with the model, so its spec leaves out what is
the team's or the server's own: the rewards are named with their weights only (a python
grader's source, a verifier's name and args stay out unless ``export.card_includes_rewards``)
and every ``path:`` source, a name on the server's disk, is replaced by a placeholder. With
LoRA, ``adapter_config.json`` is the checkpoint's with the base model named by the spec's
source (``path:NAME``, ``hf:owner/name``, ``job:ID``) rather than the folder it was loaded from
on the server, which means nothing to whoever downloads it and is not theirs to see.

Everything but the LoRA merge is torch-free, so the API streams the same folder for any kept
checkpoint (:func:`model_files`, :func:`generated_files`) without loading a model; the worker
writes the final one at the end of a job (:func:`export_model`), where ``export.merge_lora``
also folds the adapter into the base weights. A full disk there is ``disk_full``, the temporary
folder removed, and the checkpoint it was made from stays whole for a retry to export again.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from grpo_core.io.disk_space import disk_full_reported
from grpo_core.spec.grpo_config import eval_metrics_of
from grpo_core.spec.run_spec import RunSpec, reward_names

ADAPTER_DIR = "adapter"  # with a merged LoRA model, the adapter itself
CARD, GENERATION_CONFIG, ADAPTER_CONFIG = "README.md", "generation_config.json", "adapter_config.json"
_GENERATED = (CARD, GENERATION_CONFIG, ADAPTER_CONFIG)
# What a checkpoint holds for resuming only; everything else at its top level is the model.
_TRAINING_STATE = re.compile(
    r"^(optimizer\.pt|scheduler\.pt|rng\.pt|trainer_state\.json|experience(-rank\d+)?\.pt)$")
_CARD_ROWS_SHOWN = 3  # inline dataset rows quoted in a card; the rest are counted
_SERVER_SOURCE = "(stored on the training service)"  # what a card shows for a path: source


def model_files(checkpoint: Path) -> list[Path]:
    """The files of ``checkpoint`` that make up the model as they are, by name (its folders,
    fsdp's ``distributed/`` state, are training state); :func:`generated_files` has the rest."""
    return sorted(p for p in checkpoint.iterdir() if p.is_file() and is_model_file(p.name))


def is_model_file(name: str) -> bool:
    """Whether a checkpoint's top-level file ``name`` is part of the model as it is."""
    return not _TRAINING_STATE.match(name) and name not in _GENERATED


def generation_config(checkpoint: Path, spec: RunSpec) -> dict[str, Any]:
    """The base model's generation config (its special tokens) with the job's sampling: what
    the policy was trained to answer with."""
    try:
        base = json.loads((checkpoint / GENERATION_CONFIG).read_text())
    except (FileNotFoundError, ValueError):
        base = {}
    grpo = spec.grpo
    sampling = {"do_sample": True, "temperature": grpo.temperature, "top_p": grpo.top_p,
                "max_new_tokens": grpo.max_completion_length}
    if grpo.top_k:
        sampling["top_k"] = grpo.top_k
    if grpo.min_p:
        sampling["min_p"] = grpo.min_p
    if grpo.repetition_penalty != 1.0:
        sampling["repetition_penalty"] = grpo.repetition_penalty
    return {**base, **sampling}


def adapter_config(checkpoint: Path, spec: RunSpec) -> dict[str, Any] | None:
    """The checkpoint's LoRA adapter config (None without one) naming the base model by the
    spec's source. Nothing reads the field back: resuming and merging load the base from the
    spec; a user passes their own copy of the base to ``PeftModel.from_pretrained``."""
    try:
        config = json.loads((checkpoint / ADAPTER_CONFIG).read_text())
    except FileNotFoundError:
        return None
    return {**config, "base_model_name_or_path": spec.model.source}


def model_card(spec: RunSpec, step: int, metrics: dict[str, Any] | None, job_id: int | None = None,
               best: dict[str, Any] | None = None, trained_steps: int | None = None) -> str:
    """Markdown with Hugging Face's YAML header: where the model came from, how it was trained
    (the spec as :func:`_card_spec` shows it), where training ended (the last step's metrics) and,
    when the run evaluated, its last eval point: the final step always is one, so its record holds it.
    With ``best`` the weights are step ``step``'s, the best eval point of a run of ``trained_steps``."""
    # Whichever spec validated the source: a scheme this core does not load (a service's) is named as is.
    scheme, _, location = spec.model.source.partition(":")
    header: dict[str, Any] = {"library_name": "peft" if spec.model.lora and not spec.export.merge_lora
                              else "transformers", "tags": ["grpo", "reinforcement-learning"]}
    if scheme == "hf":
        header["base_model"] = location.partition("@")[0]
    job = f" (job {job_id})" if job_id is not None else ""
    source = _public(spec.model.source)
    origin = f"`{source}`" if source != _SERVER_SOURCE else "a model stored on the training service"
    ended = step if best is None or trained_steps is None else trained_steps
    lines = ["---", yaml.safe_dump(header, sort_keys=False).strip(), "---", "",
             f"# {spec.name}", "",
             f"Trained with GRPO by the GRPO service{job} for {ended} steps from {origin}.", ""]
    if best is not None:
        lines += [f"These weights are step {step}'s: the best eval point by {best['metric']} "
                  f"({_number(best['value'])}; grpo.load_best_model_at_end).", ""]
    evaluated = eval_metrics_of(metrics or {})
    training = {name: value for name, value in (metrics or {}).items() if name not in evaluated}
    if training:
        lines += [f"## Metrics at step {ended}", "", *_metric_table(training)]
    if evaluated:
        lines += [f"## Evaluation at step {ended}", "", _eval_setup(spec), "", *_metric_table(evaluated)]
    lines += ["## Rewards", "", "| reward | weight |", "|---|---|",
              *(f"| {name} | {_number(reward.weight)} |"
                for name, reward in zip(reward_names(spec.rewards), spec.rewards, strict=True)), ""]
    spec_yaml = yaml.safe_dump(_card_spec(spec), sort_keys=False).strip()
    lines += ["## Training spec", "", "```yaml", spec_yaml, "```", ""]
    return "\n".join(lines)


def _card_spec(spec: RunSpec) -> dict[str, Any]:
    """The spec as a card shows it: inline rows abbreviated, ``path:`` sources replaced, and the
    rewards as their names and weights unless ``export.card_includes_rewards``."""
    shown = spec.model_dump(mode="json")
    for field in ("dataset", "eval_dataset"):
        rows = (shown.get(field) or {}).get("prompts")
        if rows is not None and len(rows) > _CARD_ROWS_SHOWN:
            more = f"... {len(rows) - _CARD_ROWS_SHOWN} more rows"
            shown[field]["prompts"] = [*rows[:_CARD_ROWS_SHOWN], more]
    if not spec.export.card_includes_rewards:
        shown["rewards"] = [{"name": name, "weight": reward.weight}
                            for name, reward in zip(reward_names(spec.rewards), spec.rewards, strict=True)]
    return _public(shown)


def _public(value: Any) -> Any:
    """``value`` with every ``path:`` source (a name under the server's folders) replaced."""
    if isinstance(value, dict):
        return {key: _public(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_public(item) for item in value]
    return _SERVER_SOURCE if isinstance(value, str) and value.startswith("path:") else value


def _metric_table(metrics: dict[str, Any]) -> list[str]:
    return ["| metric | value |", "|---|---|",
            *(f"| {name} | {_number(value)} |" for name, value in sorted(metrics.items())
              if isinstance(value, int | float) and not isinstance(value, bool)), ""]


def _eval_setup(spec: RunSpec) -> str:
    """What the eval figures measure: which prompts, how many answers each, how they pass."""
    grpo, held_out, prompts = spec.grpo, spec.eval_dataset, "the eval_dataset"
    if held_out is not None and held_out.prompts is not None:
        prompts = f"{len(held_out.prompts)} eval prompts"
    elif held_out is not None:
        prompts = f"`{held_out.source}`"
    sampling = "greedy" if grpo.eval_temperature == 0 else f"at temperature {grpo.eval_temperature:g}"
    return (f"On {prompts}, {grpo.eval_num_generations} completion(s) per prompt, {sampling}; a prompt "
            f"passes (eval_pass@k) when a completion's reward reaches {grpo.eval_pass_threshold:g}.")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) or not math.isfinite(value) else f"{value:.6g}"


def generated_files(checkpoint: Path, spec: RunSpec, step: int, metrics: dict[str, Any] | None,
                    job_id: int | None = None, best: dict[str, Any] | None = None,
                    trained_steps: int | None = None) -> dict[str, bytes]:
    """The files the model folder gains beside :func:`model_files`, by name."""
    files = {GENERATION_CONFIG: json.dumps(generation_config(checkpoint, spec), indent=2).encode(),
             CARD: model_card(spec, step, metrics, job_id, best, trained_steps).encode()}
    adapter = adapter_config(checkpoint, spec)
    if adapter is not None:
        files[ADAPTER_CONFIG] = json.dumps(adapter, indent=2).encode()
    return files


def export_model(checkpoint: Path, out: Path, spec: RunSpec, step: int, metrics: dict[str, Any] | None,
                 *, job_id: int | None = None, base_location: str | None = None,
                 best: dict[str, Any] | None = None, trained_steps: int | None = None) -> Path:
    """Write the model folder ``out`` from ``checkpoint`` (of ``step``), whole or not at all (a
    temporary folder renamed into place, replacing an older export). With ``export.merge_lora`` the
    folder holds the merged weights and ``adapter/`` the adapter; ``base_location`` is the
    base model's folder or hub id then. ``best``: the checkpoint is the run's best eval point
    (``{"step", "metric", "value"}``, grpo.load_best_model_at_end) of a run trained for
    ``trained_steps``, which the card says."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with disk_full_reported(out, "the model folder", undo=lambda: shutil.rmtree(tmp, ignore_errors=True)):
        tmp.mkdir(parents=True)
        merging = spec.model.lora is not None and spec.export.merge_lora
        files_into = tmp / ADAPTER_DIR if merging else tmp
        files_into.mkdir(exist_ok=True)
        for path in model_files(checkpoint):
            shutil.copy2(path, files_into / path.name)
        if merging:
            _merge_lora(checkpoint, tmp, spec, base_location)
        generated = generated_files(checkpoint, spec, step, metrics, job_id, best, trained_steps)
        for name, data in generated.items():
            (files_into if name == ADAPTER_CONFIG else tmp).joinpath(name).write_bytes(data)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def _merge_lora(checkpoint: Path, into: Path, spec: RunSpec, base_location: str | None) -> None:
    """Base weights with the adapter folded in, saved with the tokenizer: a plain model."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    from grpo_core.io.model_loading import load_causal_lm

    if base_location is None:
        raise ValueError("merging a LoRA adapter needs the base model's location")
    import torch

    base = load_causal_lm(base_location, spec.model.dtype, torch.device("cpu"))
    merged = PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload()
    merged.save_pretrained(into, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(checkpoint)).save_pretrained(into)
