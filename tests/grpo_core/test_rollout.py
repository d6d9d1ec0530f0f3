"""The sampling loop against transformers' ``generate``, and the masks it produces."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_core.algorithm.randomness import row_keys
from grpo_core.algorithm.rollout import (
    SamplingOptions,
    completion_mask_from_eos,
    concat_rollouts,
    sample_completions,
    tokenize_prompts,
)
from grpo_core.io.model_loading import load_tokenizer

PROMPTS = ["What is 2+3?", "hello world please reply with a long answer", "one"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_greedy_loop_matches_generate_token_for_token(tiny_model_factory, family):
    folder = tiny_model_factory(family)
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompts = tokenize_prompts(tokenizer, PROMPTS, 64, torch.device("cpu"))
    eos = torch.tensor([tokenizer.eos_token_id])
    greedy = SamplingOptions(20, greedy=True)
    ours = sample_completions(model, prompts, 1, eos, tokenizer.pad_token_id, greedy)
    theirs = model.generate(
        input_ids=prompts.ids,
        attention_mask=prompts.mask,
        max_new_tokens=20,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    reference = theirs[:, prompts.ids.size(1) :]
    width = reference.size(1)
    assert torch.equal(
        ours.completion_ids[:, :width],
        reference.masked_fill(ours.completion_mask[:, :width] == 0, tokenizer.pad_token_id),
    )
    model.train()
    keys = row_keys(0, torch.arange(len(PROMPTS)), 2)
    sample_completions(model, prompts, 2, eos, tokenizer.pad_token_id, SamplingOptions(3), keys)
    assert model.training, "sampling must restore train mode"


def test_sampling_shapes_and_groups(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = tokenize_prompts(tokenizer, PROMPTS, 64, torch.device("cpu"))
    options = SamplingOptions(max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9)
    keys = row_keys(0, torch.arange(len(PROMPTS)), 4)
    rollout = sample_completions(
        model, prompts, 4, torch.tensor([tokenizer.eos_token_id]), tokenizer.pad_token_id, options, keys
    )
    assert rollout.completion_ids.shape[0] == 12 and rollout.completion_ids.shape[1] <= 6
    # Rows are grouped: the four rows of a group share their prompt.
    assert torch.equal(rollout.prompt_ids[0], rollout.prompt_ids[3])
    assert not torch.equal(rollout.prompt_ids[3], rollout.prompt_ids[4])
    assert rollout.input_ids.shape[1] == rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
    # The decode loop runs under inference_mode; what it hands training must be ordinary tensors.
    fields = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "is_truncated")
    assert not any(getattr(rollout, name).is_inference() for name in fields)


def test_mask_covers_up_to_and_including_the_first_eos():
    eos = torch.tensor([9])
    ids = torch.tensor([[1, 2, 9, 3, 9], [9, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    mask = completion_mask_from_eos(ids, eos)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_prompts_are_left_padded_and_left_truncated(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    full = tokenizer(PROMPTS[1], add_special_tokens=False)["input_ids"]
    batch = tokenize_prompts(tokenizer, [PROMPTS[1], "one"], 5, torch.device("cpu"))
    assert batch.num_truncated == 1
    assert batch.ids[0].tolist() == full[-5:]  # the end of the prompt is kept
    assert batch.mask[1].tolist()[0] == 0 and batch.mask[1].tolist()[-1] == 1


def test_concat_rollouts_pads_prompts_left_and_completions_right(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    eos = torch.tensor([tokenizer.eos_token_id])
    short, long = (tokenize_prompts(tokenizer, [p], 64, torch.device("cpu")) for p in ("one", PROMPTS[1]))
    a = sample_completions(model, short, 2, eos, 0, SamplingOptions(3), row_keys(0, torch.tensor([0]), 2))
    b = sample_completions(model, long, 2, eos, 0, SamplingOptions(5), row_keys(0, torch.tensor([1]), 2))
    joined = concat_rollouts([a, b], pad_id=0)
    assert joined.prompt_ids.shape == (4, b.prompt_ids.size(1))
    assert joined.completion_ids.shape[1] == max(a.completion_ids.size(1), b.completion_ids.size(1))
    assert torch.equal(joined.prompt_ids[0, -a.prompt_ids.size(1) :], a.prompt_ids[0])
    assert torch.equal(joined.completion_ids[0, : a.completion_ids.size(1)], a.completion_ids[0])
    assert joined.completion_mask[:2, a.completion_ids.size(1) :].sum() == 0


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rows_that_finish_early_leave_the_batch_without_changing_the_others(tiny_model_factory, family):
    """Pick as EOS a token row 0 emits early, so rows finish at different steps and the loop
    drops them from the KV cache; the survivors must still match ``generate`` exactly."""
    folder = tiny_model_factory(family)
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompts = tokenize_prompts(tokenizer, PROMPTS, 64, torch.device("cpu"))
    free_run = model.generate(
        input_ids=prompts.ids,
        attention_mask=prompts.mask,
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
    )
    early = int(free_run[0, prompts.ids.size(1) + 1])
    ours = sample_completions(
        model, prompts, 1, torch.tensor([early]), tokenizer.pad_token_id, SamplingOptions(12, greedy=True)
    )
    theirs = model.generate(
        input_ids=prompts.ids,
        attention_mask=prompts.mask,
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=early,
    )[:, prompts.ids.size(1) :]
    lengths = ours.completion_mask.sum(1)
    assert lengths[0] <= 2 and lengths.max() > lengths[0], "rows must finish at different steps"
    width = theirs.size(1)
    expected = theirs.masked_fill(ours.completion_mask[:, :width] == 0, tokenizer.pad_token_id)
    assert torch.equal(ours.completion_ids[:, :width], expected)
