"""Multi-turn episodes with tools on a tiny random model, the tools run in the real sandbox: the
trajectory keeps the sampled tokens and the rendered observations, ``model_mask`` marks exactly
the model's tokens, the update's log-probs of every model token equal those of the context it
was sampled in (each turn scored alone, unpadded), an episode that answers at once is the
single-turn sample, and budgets end episodes as truncated."""

from __future__ import annotations

import pytest
import torch
from sandbox_guard import needs_sandbox
from tool_models import TOOLS, Script, prompt_texts, tuned_to_call, with_tool_tokens

from grpo_core.agents.rendering import Conversations
from grpo_core.algorithm.episodes import AgentSetup, episode_metrics, sample_episodes
from grpo_core.algorithm.logprobs import completion_logprobs
from grpo_core.algorithm.randomness import row_keys
from grpo_core.algorithm.rollout import SamplingOptions, sample_completions, tokenize_prompts
from grpo_core.algorithm.shared_prompts import prompt_owners, rollout_logprobs
from grpo_core.rewards.sandbox import Limits
from grpo_core.spec.run_spec import ReasoningSpec
from grpo_core.spec.tool_schemas import tool_set

pytestmark = needs_sandbox

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return with_tool_tokens(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tuned(tiny):
    """The tiny model fitted to use its tool (tests/tool_models.py): a real model, so sampling
    goes through the same decoder as any job's."""
    return tuned_to_call(*tiny)


def setup_for(tokenizer, **overrides) -> AgentSetup:
    tools = tool_set([TOOLS])
    values = {
        "conversations": Conversations(tokenizer, tools),
        "tools": tools,
        "tool_limits": Limits(wall_seconds=10),
        "max_tool_calling_iterations": None,
        "max_trajectory_length": 1024,
    }
    values.update(overrides)
    return AgentSetup(**values)


def run(model, tokenizer, setup, max_new=24, g=2, greedy=False):
    texts = prompt_texts(setup.conversations)
    prompts = tokenize_prompts(tokenizer, texts, 1024, torch.device("cpu"))
    keys = None if greedy else row_keys(7, torch.arange(len(texts)), g)
    options = SamplingOptions(max_new, greedy=greedy)
    eos = torch.tensor([tokenizer.eos_token_id])
    return prompts, sample_episodes(
        model, prompts, [True] * len(texts), g, eos, tokenizer, options, keys, setup, ReasoningSpec()
    )


def test_a_tool_call_is_run_and_its_result_appended_as_observation_tokens(tuned) -> None:
    model, tokenizer = tuned
    script = Script(tokenizer)
    prompts, (rollout, decoded, stats) = run(model, tokenizer, setup_for(tokenizer), max_new=120, greedy=True)
    assert stats.turns == [2, 2, 2, 2] and stats.tool_calls == [1, 1, 1, 1] and stats.tool_errors == [0] * 4
    assert stats.messages[0][1] == {"role": "tool", "name": "add", "content": "5"}
    assert episode_metrics(stats.rows()) == {
        "turns/mean": 2.0,
        "turns/max": 2.0,
        "tool_calls/mean": 1.0,
        "tool_errors/frequency": 0.0,
    }
    conversations = Conversations(tokenizer, tool_set([TOOLS]))
    observation = conversations.observation_ids(conversations.tool_messages([("add", "5")]), chat=True)
    for row in range(4):
        ids = rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()
        sampled = rollout.model_mask[row][rollout.completion_mask[row].bool()].tolist()
        assert ids == script.call + observation + script.answer  # sampled, then rendered, then sampled
        assert sampled == [1] * len(script.call) + [0] * len(observation) + [1] * len(script.answer)
    assert decoded[0].answer == "5" and not rollout.is_truncated.any()


def test_every_model_token_is_scored_in_the_context_it_was_sampled_in(tuned) -> None:
    """The update's forward over the whole padded trajectory batch gives each model token the
    log-prob that its own turn's context, alone and unpadded, gives it."""
    model, tokenizer = tuned
    _, (rollout, _, stats) = run(model, tokenizer, setup_for(tokenizer), max_new=120)
    assert max(stats.turns) == 2  # sampled, not greedy: still the tuned path, at least once
    with torch.no_grad():
        # What the update computes: each prompt once for its G trajectories.
        assert prompt_owners(rollout.prompt_ids, rollout.prompt_mask) is not None
        batched, _ = rollout_logprobs(model, rollout)
    for row in range(rollout.completion_ids.size(0)):
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        tokens = rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()
        for t, sampled in enumerate(rollout.model_mask[row][: len(tokens)].tolist()):
            if not sampled:
                continue
            context = torch.tensor([prompt + tokens[: t + 1]])
            with torch.no_grad():
                alone, _ = completion_logprobs(model, context, torch.ones_like(context), 1)
            assert torch.allclose(batched[row, t], alone[0, 0], atol=1e-5), (row, t)


def test_an_episode_that_answers_at_once_is_the_single_turn_sample(tiny) -> None:
    model, tokenizer = tiny  # the random model writes no tool call
    setup = setup_for(tokenizer)
    prompts, (rollout, _, stats) = run(model, tokenizer, setup, max_new=12)
    assert stats.turns == [1, 1, 1, 1] and stats.tool_calls == [0] * 4
    single = sample_completions(
        model,
        prompts,
        2,
        torch.tensor([tokenizer.eos_token_id]),
        tokenizer.pad_token_id,
        SamplingOptions(12),
        row_keys(7, torch.arange(2), 2),
    )
    width = single.completion_ids.size(1)
    assert torch.equal(
        rollout.completion_ids[:, :width] * single.completion_mask,
        single.completion_ids * single.completion_mask,
    )
    assert torch.equal(rollout.model_mask[:, :width], single.completion_mask)


def test_budgets_end_episodes(tuned) -> None:
    model, tokenizer = tuned
    script = Script(tokenizer)
    # No tool-calling turn allowed: the call is not run, and the episode ends with that turn.
    _, (rollout, _, stats) = run(
        model, tokenizer, setup_for(tokenizer, max_tool_calling_iterations=0), max_new=120, greedy=True
    )
    assert stats.turns == [1] * 4 and stats.tool_calls == [0] * 4 and not rollout.is_truncated.any()
    # The model-token budget runs out inside the call: truncated, nothing run.
    _, (rollout, _, stats) = run(
        model, tokenizer, setup_for(tokenizer), max_new=len(script.call) - 1, greedy=True
    )
    assert rollout.is_truncated.all() and stats.turns == [1] * 4 and stats.tool_calls == [0] * 4
    assert rollout.model_mask.sum(dim=1).tolist() == [len(script.call) - 1] * 4
    # No room for the observation within the trajectory bound: ends after the call, truncated.
    prompt_length = int(
        tokenize_prompts(
            tokenizer, prompt_texts(setup_for(tokenizer).conversations), 1024, torch.device("cpu")
        )
        .mask.sum(dim=1)
        .max()
    )
    tight = setup_for(tokenizer, max_trajectory_length=prompt_length + len(script.call) + 2)
    _, (rollout, _, stats) = run(model, tokenizer, tight, max_new=120, greedy=True)
    assert rollout.is_truncated.all() and stats.tool_calls == [1] * 4 and stats.turns == [1] * 4
