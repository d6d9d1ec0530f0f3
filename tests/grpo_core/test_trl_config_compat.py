"""A TRL ``GRPOConfig`` pasted under ``grpo:``: the fields we share have TRL's defaults and meaning
(compared with the installed TRL and transformers), and every other TRL field is refused with what
to use instead. TRL is a test-only dependency; it is imported by the fixtures that need it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from core_specs import spec_dict
from transformers import AutoModelForCausalLM

from grpo_core.algorithm.optim import build_scheduler
from grpo_core.algorithm.rollout import SamplingOptions, sample_completions, tokenize_prompts
from grpo_core.algorithm.sampling import apply_min_p, apply_repetition_penalty, next_token_scores, seen_tokens
from grpo_core.io.model_loading import load_tokenizer
from grpo_core.run.local_run import run_local
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.run_spec import RunSpec
from grpo_core.spec.spec_file import InvalidSpec, parse_spec
from grpo_core.spec.trl_fields import OFF, REFUSED

# RunSpec's top-level fields that share a TRL name, and why their defaults are written differently.
SAME_MEANING = {"report_to": ("none", [], "TRL's 'none' and our empty list both mean: no trackers")}
# TRL 1.16's defaults that ask for something this service does differently, so a config holding them
# is refused rather than quietly trained otherwise; every other default of a field we do not take is
# ignored with a warning (grpo_core.spec.trl_fields.OFF).
DEFAULTS_THAT_ASK_FOR_SOMETHING = {
    "per_device_train_batch_size": "8 completions per device and micro-batch: a batch size",
    "bf16": "None: TRL then trains in bf16",
    "save_steps": "500: a checkpoint cadence unlike checkpoint_every's default",
    "logging_steps": "10: a logging cadence; every step is kept here",
    "logging_nan_inf_filter": "True: a non-finite loss fails the step here",
    "log_level_replica": "'warning': a log level the service does not set",
    "ddp_timeout": "1800: the service's rank timeout is the operator's setting",
    "shuffle_dataset": "True: dataset.shuffle may say otherwise",
    "disable_dropout": "False: dropout is always off here",
}


@pytest.fixture(scope="module")
def trl_defaults() -> dict[str, Any]:
    """Every field of the installed ``trl.GRPOConfig`` with its declared default."""
    import trl

    def default(field: dataclasses.Field) -> Any:
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return field.default

    return {field.name: default(field) for field in dataclasses.fields(trl.GRPOConfig)}


def test_every_shared_field_has_trls_default(trl_defaults: dict[str, Any]) -> None:
    ours = GRPOConfig()
    shared = sorted(set(GRPOConfig.model_fields) & set(trl_defaults))
    # The ones the issue measured as different, so a TRL rename cannot empty the comparison.
    assert {"max_completion_length", "beta", "seed", "gradient_checkpointing", "max_steps",
            "lr_scheduler_type", "num_train_epochs", "warmup_steps", "repetition_penalty", "min_p",
            "save_total_limit"} <= set(shared)
    different = {name: (getattr(ours, name), trl_defaults[name]) for name in shared
                 if getattr(ours, name) != trl_defaults[name]}
    assert not different, f"ours vs TRL: {different}"
    top_level = set(RunSpec.model_fields) & set(trl_defaults)
    assert top_level == set(SAME_MEANING)
    for name, (theirs, ours_default, _reason) in SAME_MEANING.items():
        assert (trl_defaults[name], RunSpec.model_fields[name].get_default(call_default_factory=True)) == (
            theirs, ours_default)


def test_every_trl_field_is_accepted_or_refused_with_advice(trl_defaults: dict[str, Any]) -> None:
    """A field a new TRL release adds fails here until it is mapped or given advice."""
    accepted = set(GRPOConfig.model_fields) | set(RunSpec.model_fields)
    unplaced = sorted(name for name in trl_defaults if name not in accepted and name not in REFUSED)
    assert not unplaced, f"add these to grpo_core.spec.trl_fields.REFUSED or accept them: {unplaced}"


def test_every_value_taken_as_off_is_trls_default(trl_defaults: dict[str, Any]) -> None:
    """A TRL release that changes a default makes its field refused here until it is looked at."""
    assert OFF.keys() <= REFUSED.keys()
    changed = {name: (value, trl_defaults.get(name, "not a TRL field")) for name, value in OFF.items()
               if type(trl_defaults.get(name)) is not type(value) or trl_defaults.get(name) != value}
    assert not changed, f"ours vs TRL: {changed}"


def test_trls_whole_default_config_is_taken_but_for_defaults_that_ask_for_something(
        tmp_path, trl_defaults: dict[str, Any]) -> None:
    """Every field of TRL's GRPOConfig at its default, pasted under grpo:: the ones we share are
    taken, the ones that ask for nothing are ignored with a warning each, the rest refused."""
    pasted = {**spec_dict(tmp_path), "grpo": {**spec_dict(tmp_path)["grpo"], **trl_defaults}}
    with pytest.raises(InvalidSpec) as info:
        parse_spec(pasted)
    assert {error.field for error in info.value.errors} == {
        f"grpo.{name}" for name in DEFAULTS_THAT_ASK_FOR_SOMETHING}
    for name in DEFAULTS_THAT_ASK_FOR_SOMETHING:
        del pasted["grpo"][name]
    spec = parse_spec(pasted)
    ignored = set(trl_defaults) - set(GRPOConfig.model_fields) - set(DEFAULTS_THAT_ASK_FOR_SOMETHING)
    assert {warning.field for warning in spec.warnings()} == {f"grpo.{name}" for name in ignored}
    dumped = set(spec.model_dump()["grpo"])
    assert dumped <= set(GRPOConfig.model_fields)  # nothing ignored is kept
    # Evaluation's, agents' and the best checkpoint's fields, at TRL's defaults (eval_strategy "no",
    # no tool-calling limit, no chat template kwargs, no best model), are left out of a dump as a
    # spec without them dumped before they existed; every other field is there.
    added_later = {"max_tool_calling_iterations", "max_trajectory_length", "chat_template_kwargs",
                   "metric_for_best_model", "greater_is_better", "load_best_model_at_end",
                   "early_stopping_patience", "early_stopping_threshold"}
    assert set(GRPOConfig.model_fields) - dumped == {name for name in GRPOConfig.model_fields
                                                      if name.startswith("eval_") or name in added_later}


@pytest.mark.parametrize(("field", "value"), [("push_to_hub", False), ("use_vllm", False),
                                              ("log_completions", False), ("vllm_server_timeout", 240)])
def test_a_trl_field_that_asks_for_nothing_is_ignored_with_a_warning(tmp_path, field: str,
                                                                     value: Any) -> None:
    spec = parse_spec(spec_dict(tmp_path, **{field: value}))
    [warning] = spec.warnings()
    assert warning.field == f"grpo.{field}"
    assert warning.message.startswith("ignored:") and f"'{field}'" in warning.message
    assert field not in spec.model_dump()["grpo"]
    assert parse_spec(spec.model_dump()).warnings() == []  # the stored spec says it no more


@pytest.mark.parametrize(("field", "value"), [("push_to_hub", True), ("use_vllm", True),
                                              ("log_completions", 0), ("vllm_server_timeout", 30)])
def test_a_trl_field_that_asks_for_something_is_still_refused(tmp_path, field: str, value: Any) -> None:
    """YAML's 0 is not false: only TRL's default, as written, asks for nothing."""
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict(tmp_path, **{field: value}))
    [error] = info.value.errors
    assert error.field == f"grpo.{field}" and "does not take" in error.reason


def trl_config(tmp_path, **fields: Any) -> Any:
    """The installed TRL's own ``GRPOConfig`` (after its ``__post_init__``), on the CPU."""
    import trl

    return trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **fields)


def test_scale_rewards_takes_trls_boolean_spellings(tmp_path) -> None:
    for value in (False, True):
        theirs = trl_config(tmp_path, scale_rewards=value).scale_rewards
        assert parse_spec(spec_dict(tmp_path, scale_rewards=value)).grpo.scale_rewards == theirs
    dr_grpo = parse_spec(spec_dict(tmp_path, scale_rewards=False, loss_type="dr_grpo"))
    assert dr_grpo.grpo.scale_rewards == "none"


@pytest.mark.parametrize(("batch", "accumulation", "generations"), [(16, 1, 8), (8, 4, 4), (6, 2, 3)])
def test_per_device_train_batch_size_is_refused_with_the_prompts_per_step_it_means(
        tmp_path, batch: int, accumulation: int, generations: int) -> None:
    """TRL's completions per generation batch, divided into groups, are our prompts per step."""
    theirs = trl_config(tmp_path, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                        num_generations=generations)
    prompts = theirs.generation_batch_size // generations
    data = spec_dict(tmp_path, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                     num_generations=generations)
    with pytest.raises(InvalidSpec) as info:
        parse_spec(data)
    [error] = info.value.errors
    assert ("grpo.prompts_per_step = per_device_train_batch_size × resources.gpus × "
            "gradient_accumulation_steps / num_generations") in error.reason
    assert f"{batch} × 1 × {accumulation} / {generations} = {prompts} on one GPU" in error.reason


@pytest.mark.parametrize(("where", "field", "hint"), [
    ("grpo", "num_generation", "did you mean 'num_generations'?"),
    ("grpo", "learnig_rate", "did you mean 'learning_rate'?"),
    ("grpo", "checkpoint_every", "belongs at the top level"),
    ("top", "learning_rate", "belongs under grpo: write it as grpo.learning_rate"),
    ("top", "num_generation", "did you mean 'grpo.num_generations'?"),
    ("top", "checkpoint_evry", "did you mean 'checkpoint_every'?"),
    ("top", "push_to_hub", "TRL's fields go under grpo:"),
])
def test_an_unknown_field_is_told_as_the_nearest_one(tmp_path, where: str, field: str, hint: str) -> None:
    data = spec_dict(tmp_path)
    (data["grpo"] if where == "grpo" else data)[field] = 4
    with pytest.raises(InvalidSpec) as info:
        parse_spec(data)
    [error] = info.value.errors
    assert error.field == (f"grpo.{field}" if where == "grpo" else field)
    assert hint in error.reason


def test_a_nested_typo_is_told_as_the_nearest_field_of_its_own_section(tmp_path) -> None:
    data = spec_dict(tmp_path)
    data["rewards"][1]["wieght"] = data["rewards"][1].pop("weight")
    data["model"]["lora"] = {"r": 4, "alpah": 8}
    with pytest.raises(InvalidSpec) as info:
        parse_spec(data)
    assert {error.field: error.reason for error in info.value.errors} == {
        "rewards.1.wieght": "unknown field; did you mean 'weight'?",
        "model.lora.alpah": "unknown field; did you mean 'alpha'?"}


@pytest.mark.parametrize(("field", "value", "advice"), [
    ("per_device_train_batch_size", 8, "grpo.prompts_per_step"),
    ("bf16", True, "model.dtype"),
    ("save_steps", 100, "checkpoint_every"),
    ("use_vllm", True, "not vLLM"),
    ("reward_weights", [1.0], "rewards[].weight"),
    ("output_dir", "out", "the service manages"),
    ("report_to", "wandb", "top level"),
    ("warmup_ratio", 0.1, "grpo.warmup_steps below 1"),
])
def test_a_refused_field_names_itself_and_the_replacement(tmp_path, field: str, value: Any,
                                                          advice: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict(tmp_path, **{field: value}))
    [error] = info.value.errors
    assert error.field == f"grpo.{field}"
    assert f"'{field}'" in error.reason and advice in error.reason


def test_grpo_train_refuses_a_trl_field_with_exit_code_2(tmp_path, capsys) -> None:
    from grpo_core.cli import main

    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(spec_dict(tmp_path, save_steps=50)))  # JSON is YAML
    assert main(["train", str(spec), "--output-dir", str(tmp_path / "never"), "--quiet"]) == 2
    assert "error: grpo.save_steps: 'save_steps' is a TRL GRPOConfig field" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_grpo_train_tells_each_ignored_trl_field_on_stderr(tiny_model_dir, tmp_path, capsys) -> None:
    from grpo_core.cli import main

    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(spec_dict(tiny_model_dir, max_steps=1, push_to_hub=False, use_vllm=False)))
    assert main(["train", str(spec), "--output-dir", str(tmp_path / "run"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning: grpo.push_to_hub: ignored: false is TRL's default" in err
    assert "warning: grpo.use_vllm: ignored: false is TRL's default" in err


def test_specs_stored_before_the_rename_still_read_the_same(tmp_path) -> None:
    """Stored specs are fully materialised (every default written out), with the old name."""
    old = spec_dict(tmp_path, max_steps=500, beta=0.04, seed=0, gradient_checkpointing=False)
    del old["grpo"]["lr_scheduler_type"]
    for legacy, warmup, now in (("constant", 0, "constant"), ("constant", 5, "constant_with_warmup"),
                                ("linear", 5, "linear"), ("cosine", 0, "cosine")):
        stored = {**old, "grpo": {**old["grpo"], "lr_scheduler": legacy, "warmup_steps": warmup}}
        config = parse_spec(stored).grpo
        assert (config.lr_scheduler_type, config.max_steps, config.beta, config.seed) == (now, 500, 0.04, 0)
    with pytest.raises(InvalidSpec) as info:
        parse_spec({**old, "grpo": {**old["grpo"], "lr_scheduler": "linear", "lr_scheduler_type": "linear"}})
    assert "lr_scheduler_type only" in str(info.value)


# --- learning-rate schedule -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["constant", "constant_with_warmup", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3, 0.25])
def test_schedules_match_transformers_step_by_step(name: str, warmup: float) -> None:
    from transformers import TrainingArguments, get_scheduler

    total = 10
    config = GRPOConfig(lr_scheduler_type=name, warmup_steps=warmup, max_steps=total, learning_rate=0.1)
    args = TrainingArguments(output_dir="unused", warmup_steps=warmup, report_to=[], use_cpu=True)

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)

    ours, theirs = optimizer(), optimizer()
    our_schedule = build_scheduler(ours, config)
    their_schedule = get_scheduler(name, theirs, num_warmup_steps=args.get_warmup_steps(total),
                                   num_training_steps=total)
    our_rates, their_rates = [], []
    for _ in range(total):
        our_rates.append(our_schedule.get_last_lr()[0])
        their_rates.append(their_schedule.get_last_lr()[0])
        ours.step(), theirs.step(), our_schedule.step(), their_schedule.step()
    assert our_rates == pytest.approx(their_rates, abs=1e-12)


# --- epochs ---------------------------------------------------------------------------------------


def test_an_epoch_is_one_pass_over_the_prompts() -> None:
    config = GRPOConfig(prompts_per_step=3, num_generations=2, num_train_epochs=2.0)
    assert config.steps_for(10) == 2 * 4  # ceil(10 / 3) batches a pass
    assert config.model_copy(update={"num_train_epochs": 1.5}).steps_for(10) == 6
    assert config.model_copy(update={"num_iterations": 2}).steps_for(10) == 16  # mu steps per batch
    assert config.model_copy(update={"max_steps": 5}).steps_for(10) == 5  # max_steps wins, as in TRL
    assert GRPOConfig().steps_for(64) == 3 * 8  # TRL's defaults: 3 epochs of 8-prompt steps
    # A generation round of 2 steps draws 6 prompts: ceil(10 / 6) rounds of 2 steps a pass.
    assert config.model_copy(update={"steps_per_generation": 2}).steps_for(10) == 2 * 2 * 2


def test_a_run_by_epochs_trains_that_many_steps_and_decays_over_them(tiny_model_dir, tmp_path) -> None:
    """8 prompts, 4 a step, one epoch: 2 steps, and the linear schedule spans those 2."""
    data = spec_dict(tiny_model_dir, max_steps=-1, num_train_epochs=1, prompts_per_step=4,
                     lr_scheduler_type="linear")
    out = tmp_path / "run"
    result = run_local(RunSpec.model_validate(data), tmp_path, out, device="cpu", progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rate = data["grpo"]["learning_rate"]
    assert result.step == 2
    assert [r["learning_rate"] for r in records] == pytest.approx([rate, rate / 2])


# --- sampling -------------------------------------------------------------------------------------


def _logits(rows: int = 4, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(rows, vocab, generator=gen) * 3, torch.randint(0, vocab, (rows, 12), generator=gen)


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 0.9])
def test_min_p_filters_as_transformers_does(min_p: float) -> None:
    from transformers.generation.logits_process import MinPLogitsWarper

    logits, ids = _logits()
    theirs = MinPLogitsWarper(min_p=min_p)(ids, logits.clone())
    torch.testing.assert_close(apply_min_p(logits, min_p), theirs)


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_is_transformers_processor(penalty: float) -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits, ids = _logits()
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    ours = apply_repetition_penalty(logits, seen_tokens(ids, torch.ones_like(ids), logits.size(1)), penalty)
    torch.testing.assert_close(ours, theirs)


def test_the_whole_filter_chain_gives_transformers_distribution() -> None:
    """Repetition penalty, temperature, top-k, top-p and min-p, in generate()'s order."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits, ids = _logits(vocab=200)
    chain = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), TemperatureLogitsWarper(0.7),
                                 TopKLogitsWarper(40), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)])
    theirs = chain(ids, logits.clone()).softmax(dim=-1)
    seen = seen_tokens(ids, torch.ones_like(ids), logits.size(1))
    ours = next_token_scores(logits, 0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.5,
                             seen=seen).softmax(dim=-1)
    torch.testing.assert_close(ours, theirs)
    assert ours.ne(0).sum() < logits.numel(), "the filters removed tokens"


def test_repetition_penalty_in_the_loop_matches_generate(tiny_model_factory) -> None:
    """Greedy with a penalty, prompt and completion tokens penalized as they appear; one
    unpadded prompt, where transformers and our loop penalize the same tokens."""
    folder = tiny_model_factory("llama")
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompts = tokenize_prompts(tokenizer, ["one two three one two three"], 64, torch.device("cpu"))
    eos = torch.tensor([tokenizer.eos_token_id])
    completions = {}
    for penalty in (1.0, 3.0):
        ours = sample_completions(model, prompts, 1, eos, tokenizer.pad_token_id,
                                  SamplingOptions(16, repetition_penalty=penalty, greedy=True))
        theirs = model.generate(input_ids=prompts.ids, attention_mask=prompts.mask, max_new_tokens=16,
                                do_sample=False, repetition_penalty=penalty,
                                pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id)[:, prompts.ids.size(1):]
        width = theirs.size(1)
        expected = theirs.masked_fill(ours.completion_mask[:, :width] == 0, tokenizer.pad_token_id)
        assert torch.equal(ours.completion_ids[:, :width], expected)
        completions[penalty] = ours.completion_ids
    assert not torch.equal(completions[1.0], completions[3.0]), "the penalty changed what was generated"


def test_the_exported_generation_config_samples_as_the_job_did(tmp_path) -> None:
    from grpo_core.io.model_export import generation_config

    spec = parse_spec(spec_dict(tmp_path, min_p=0.05, repetition_penalty=1.2))
    config = generation_config(tmp_path, spec)
    assert (config["min_p"], config["repetition_penalty"]) == (0.05, 1.2)
    plain = generation_config(tmp_path, parse_spec(spec_dict(tmp_path)))
    assert "min_p" not in plain and "repetition_penalty" not in plain  # generate()'s defaults


# --- checkpoints ----------------------------------------------------------------------------------


def test_save_total_limit_keeps_that_many_checkpoints(tiny_model_dir, tmp_path) -> None:
    data = {**spec_dict(tiny_model_dir, max_steps=4, save_total_limit=2), "checkpoint_every": 1}
    spec = RunSpec.model_validate(data)
    assert spec.checkpoint_keep_last == 2
    out = tmp_path / "run"
    run_local(spec, tmp_path, out, device="cpu", progress=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "step-4"]


def test_save_total_limit_and_checkpoint_keep_last_must_agree(tmp_path) -> None:
    data = spec_dict(tmp_path, save_total_limit=2)
    assert parse_spec({**data, "checkpoint_keep_last": 2}).checkpoint_keep_last == 2
    with pytest.raises(InvalidSpec) as info:
        parse_spec({**data, "checkpoint_keep_last": 5})
    [error] = info.value.errors
    assert error.field == "grpo.save_total_limit" and "checkpoint_keep_last" in error.reason
    # The stored (materialised) spec holds both, equal: it reads back the same.
    stored = parse_spec(data).model_dump(mode="json")
    assert parse_spec(stored).checkpoint_keep_last == 2
