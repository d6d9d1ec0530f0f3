"""A 3-turn environment episode's step time against the same number of model tokens sampled in one
turn (issue 34, goal: at most 1.3x).

What is measured
    One GRPO step's work on B prompts x G episodes, with the same model and the same number of
    model tokens on both sides:

    * ``multi-turn``: :func:`grpo_core.algorithm.episodes.sample_episodes` against a real
      environment in the real sandbox (one sandboxed interpreter per episode, started and reset,
      then a step after each turn), 3 turns of K model tokens each, the observations rendered and
      appended between turns; then the update's forward and backward over the trajectories.
    * ``single-turn``: :func:`grpo_core.algorithm.rollout.sample_completions` generating 3·K tokens
      per row (no EOS can end it early), then the same forward and backward.

    The model is the tiny Llama widened (``--hidden``, ``--layers``) and fitted for a few seconds
    to answer every user turn with the same K tokens and EOS, so that greedy episodes take exactly
    3 turns of K tokens; the ratio is multi-turn / single-turn, on medians of interleaved repeats
    (a burst of load from other processes falls on both sides). The multi-turn side's time is
    broken down: the sandboxes' start and reset, the environment's steps, the rest.

Run: ``.venv/bin/python benchmarks/agent_turns.py [--prompts 4 --generations 8 --turn-tokens 32
--repeats 5]``. Needs bubblewrap (the sandbox).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import format_table  # noqa: E402
from grpo_core.agents import environment_runner  # noqa: E402
from grpo_core.agents.environment_setup import EnvironmentSetup  # noqa: E402
from grpo_core.agents.rendering import Conversations  # noqa: E402
from grpo_core.algorithm.episodes import AgentSetup, sample_episodes  # noqa: E402
from grpo_core.algorithm.logprobs import completion_logprobs  # noqa: E402
from grpo_core.algorithm.rollout import SamplingOptions, sample_completions, tokenize_prompts  # noqa: E402
from grpo_core.io.tiny_models import build_tiny_model  # noqa: E402
from grpo_core.rewards.sandbox import Limits, sandbox_problem  # noqa: E402
from grpo_core.spec.environment_spec import EnvironmentSpec  # noqa: E402
from grpo_core.spec.run_spec import ReasoningSpec  # noqa: E402

TURNS = 3
GAME = """
class Environment:
    def reset(self, item):
        self.turns = 0
        return None

    def step(self, action):
        self.turns += 1
        return {"observation": "Go on.", "reward": 0.0, "done": self.turns >= 3}
"""


class Timed:
    """Seconds spent in the environment runner's start (sandboxes started and reset) and steps."""

    def __init__(self) -> None:
        self.start = self.steps = 0.0
        episodes = environment_runner.EnvironmentEpisodes
        original_init, original_step = episodes.__init__, episodes.step
        timed = self

        def init(self, *args, **kwargs):
            began = time.perf_counter()
            original_init(self, *args, **kwargs)
            timed.start += time.perf_counter() - began

        def step(self, *args, **kwargs):
            began = time.perf_counter()
            try:
                return original_step(self, *args, **kwargs)
            finally:
                timed.steps += time.perf_counter() - began

        episodes.__init__, episodes.step = init, step

    def reset(self) -> None:
        self.start = self.steps = 0.0


def fitted_model(folder: Path, hidden: int, layers: int, k: int, prompts: list[list[dict]]):
    """The tiny model widened, fitted to answer each user turn with the same ``k`` tokens and EOS
    (``k`` at most the tokenizer's ordinary tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_model(folder, hidden_size=hidden, num_layers=layers, seed=1)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).train()
    conversations = Conversations(tokenizer, None)
    # Distinct tokens in a fixed order: each names the next, so the model learns the turn quickly
    # and stops after exactly k (a repeated token would have it count).
    ordinary = [t for t in range(len(tokenizer)) if t not in set(tokenizer.all_special_ids)]
    order = torch.randperm(len(ordinary), generator=torch.Generator().manual_seed(0))[:k].tolist()
    answer = [ordinary[i] for i in order] + [tokenizer.eos_token_id]
    observation = conversations.observation_ids([{"role": "user", "content": "Go on."}], chat=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        for prompt in prompts:
            ids = tokenizer(conversations.prompt_text(prompt), add_special_tokens=False)["input_ids"]
            labels = [-100] * len(ids)
            for turn in range(TURNS):
                ids, labels = ids + answer, labels + answer
                if turn < TURNS - 1:
                    ids, labels = ids + observation, labels + [-100] * len(observation)
            model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.eval(), tokenizer, conversations, len(answer)


def update(model, rollout) -> None:
    """The update's work on a rollout: the policy's forward with gradients, then backward."""
    model.train()
    logprobs, _ = completion_logprobs(
        model, rollout.input_ids, rollout.attention_mask, rollout.completion_ids.size(1)
    )
    (logprobs * rollout.completion_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    model.eval()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument(
        "--turn-tokens", type=int, default=32, help="K: model tokens of each turn, EOS included"
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if (problem := sandbox_problem()) is not None:
        print(f"the sandbox does not work here: {problem}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    prompts = [[{"role": "user", "content": f"Play round {i}."}] for i in range(args.prompts)]
    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer, conversations, turn = fitted_model(
            Path(scratch), args.hidden, args.layers, args.turn_tokens - 1, prompts
        )
    batch = tokenize_prompts(
        tokenizer, [conversations.prompt_text(p) for p in prompts], 256, torch.device("cpu")
    )
    environment = EnvironmentSetup.of(EnvironmentSpec(source=GAME, max_turns=TURNS))
    setup = AgentSetup(conversations, None, Limits(), None, 4096, environment, max_prompt_length=256)
    items = [{"prompt": p} for p in prompts]
    budget = TURNS * turn
    eos = torch.tensor([tokenizer.eos_token_id])
    never = torch.tensor([len(tokenizer) + 7])  # no token ends a single-turn row early
    timed = Timed()

    def multi() -> tuple[float, int]:
        began = time.perf_counter()
        rollout, _, stats = sample_episodes(
            model,
            batch,
            [True] * len(prompts),
            args.generations,
            eos,
            tokenizer,
            SamplingOptions(budget, greedy=True),
            None,
            setup,
            ReasoningSpec(),
            items=items,
        )
        assert stats.turns == [TURNS] * len(stats.turns), stats.turns
        update(model, rollout)
        return time.perf_counter() - began, int(rollout.model_mask.sum())

    def single() -> tuple[float, int]:
        began = time.perf_counter()
        rollout = sample_completions(
            model,
            batch,
            args.generations,
            never,
            tokenizer.pad_token_id,
            SamplingOptions(budget, greedy=True),
            None,
        )
        update(model, rollout)
        return time.perf_counter() - began, int(rollout.completion_mask.sum())

    multi()  # warm-up: the first sandbox start and the first forward pay one-off costs
    single()
    multi_times, single_times, starts, steps = [], [], [], []
    for repeat in range(args.repeats):
        timed.reset()
        order = (multi, single) if repeat % 2 == 0 else (single, multi)
        for side in order:
            seconds, tokens = side()
            (multi_times if side is multi else single_times).append(seconds)
            if side is multi:
                multi_tokens = tokens
                starts.append(timed.start)
                steps.append(timed.steps)
            else:
                single_tokens = tokens
    m, s = statistics.median(multi_times), statistics.median(single_times)
    rows = [
        ["single-turn", f"{s:.3f}", single_tokens, "", "", ""],
        [
            "multi-turn (3 turns)",
            f"{m:.3f}",
            multi_tokens,
            f"{statistics.median(starts):.3f}",
            f"{statistics.median(steps):.3f}",
            f"{m / s:.2f}",
        ],
    ]
    print(
        f"B={args.prompts} prompts x G={args.generations}, {TURNS} turns of {turn} model tokens "
        f"(hidden {args.hidden}, {args.layers} layers), medians of {args.repeats} interleaved repeats"
    )
    print(
        format_table(
            ["side", "step s", "model tokens", "sandboxes start+reset s", "env steps s", "ratio"], rows
        )
    )
    print(f"ratio multi-turn / single-turn: {m / s:.2f} (goal <= 1.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
