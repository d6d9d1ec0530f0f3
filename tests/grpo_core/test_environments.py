"""Environments: the spec's checks (from the syntax tree), an episode's own sandboxed interpreter
that keeps state across turns and shares none with other episodes, the team's failures as the
job's ``environment_error``, and episodes on a tiny random model: observations rendered and
masked out, rewards summed, ``done`` and ``max_turns`` ending episodes, a first observation in
the prompt, and every model token scored in the context it was sampled in."""

from __future__ import annotations

import socket

import pytest
import torch
from pydantic import ValidationError
from sandbox_guard import needs_sandbox
from tool_models import with_tool_tokens

from grpo_core.agents.environment_runner import EnvironmentEpisodes
from grpo_core.agents.environment_setup import EnvironmentSetup
from grpo_core.agents.rendering import Conversations, with_observation
from grpo_core.algorithm.episodes import AgentSetup, episode_metrics, sample_episodes
from grpo_core.algorithm.logprobs import completion_logprobs
from grpo_core.algorithm.randomness import row_keys
from grpo_core.algorithm.rollout import SamplingOptions, tokenize_prompts
from grpo_core.algorithm.shared_prompts import prompt_owners, rollout_logprobs
from grpo_core.errors import GRPOError
from grpo_core.rewards.sandbox import Limits
from grpo_core.spec.environment_spec import EnvironmentSpec
from grpo_core.spec.run_spec import ReasoningSpec, RunSpec

# Counts its own instances (module state): an episode that saw another's would say 2.
COUNTER = '''
MADE = 0


class Environment:
    def __init__(self):
        global MADE
        MADE += 1
        self.turns = 0

    def reset(self, item):
        self.goal = item["turns"]
        return f"Take {self.goal} turns." if item.get("greet") else None

    def step(self, action):
        self.turns += 1
        print("the environment's own output is dropped")
        return {"observation": f"turn {self.turns} of {self.goal}, instances {MADE}",
                "reward": 0.5, "done": self.turns >= self.goal}
'''


def setup_of(source: str = COUNTER, **fields) -> EnvironmentSetup:
    return EnvironmentSetup.of(EnvironmentSpec(source=source, **fields))


def spec_with(**fields) -> dict:
    return {"name": "env", "model": {"source": "path:/m"}, "dataset": {"prompts": [{"prompt": "p"}]},
            "rewards": [], "environment": {"source": COUNTER}, **fields}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = 1\n", "must define class Environment"),
        ("class Environment:\n    def reset(self, item):\n        return None\n", "needs a method step"),
        ("import numpy\nclass Environment:\n    pass\n", "imports 'numpy'"),
        ("class Environment(:\n", "does not compile"),
    ],
)
def test_an_environment_source_is_checked_from_its_syntax(source, message) -> None:
    with pytest.raises(ValidationError, match=message):
        EnvironmentSpec(source=source)


def test_a_spec_with_an_environment_needs_no_other_reward_and_refuses_what_cannot_run() -> None:
    assert RunSpec.model_validate(spec_with()).environment.max_turns == 8
    with pytest.raises(ValidationError, match="at least one reward"):
        RunSpec.model_validate({**spec_with(), "environment": None})
    with pytest.raises(ValidationError, match="tools or an environment, not both"):
        RunSpec.model_validate(spec_with(tools=[{"source": "def f(x: int) -> int:\n    '''F.\n\n    Args:\n"
                                                           "        x: X.\n    '''\n    return x\n"}]))
    with pytest.raises(ValidationError, match="named 'environment'"):
        RunSpec.model_validate(spec_with(rewards=[{"name": "environment"}]))
    with pytest.raises(ValidationError, match="sharding ddp"):
        RunSpec.model_validate(spec_with(resources={"gpus": 2, "sharding": "fsdp"}))
    gated = RunSpec.model_validate(spec_with(rewards=[{"name": "exact_match", "gate_by": "environment"}]))
    assert gated.rewards[0].gate_by == "environment"


def test_a_first_observation_ends_the_last_user_message_or_the_text() -> None:
    assert with_observation("Play.", "Go") == "Play.\n\nGo"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "Play."}]
    assert with_observation(messages, "Go")[-1] == {"role": "user", "content": "Play.\n\nGo"}
    assert messages[-1]["content"] == "Play."  # the row itself is left as it was
    assert with_observation(messages[:1], "Go")[-1] == {"role": "user", "content": "Go"}


@needs_sandbox
def test_each_episode_keeps_its_own_state_across_turns_and_shares_none() -> None:
    with EnvironmentEpisodes(setup_of(), [{"turns": 2, "greet": True}, {"turns": 3}]) as episodes:
        assert episodes.first_observations == ["Take 2 turns.", None]
        first = episodes.step({0: "a", 1: "b"})
        assert first[0].observation == "turn 1 of 2, instances 1" and first[0].reward == 0.5
        assert not first[0].done and not first[1].done
        second = episodes.step({0: "a", 1: "b"})
        assert second[0].done and second[1].observation == "turn 2 of 3, instances 1"
        episodes.finish(0)
        assert episodes.step({1: "b"})[1].done


@needs_sandbox
@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("raise KeyError('lost')", "step raised KeyError: 'lost'"),
        ("return 3", "step returned int, not a dict"),
        ("return {'done': 'yes'}", "done is str, not a bool"),
        ("return {'reward': float('nan'), 'done': True}", "not a finite number"),
        ("return {'reward': True, 'done': True}", "not a finite number"),
        ("return {'observation': 3, 'done': True}", "observation is int"),
        ("while True:\n            pass", "gave no answer to step: it ran out of time"),
        ("import os\n        os._exit(3)", "gave no answer to step: its process ended"),
        ("return {'observation': 'x' * 200000, 'done': False}", "over its output limit"),
        ("self.hoard = bytearray(512 * 2**20)", "step raised MemoryError"),  # memory_mb: 256
    ],
)
def test_an_environment_that_fails_fails_the_job_saying_how(step, message) -> None:
    source = f"class Environment:\n    def reset(self, item):\n        return None\n" \
             f"    def step(self, action):\n        {step}\n"
    with EnvironmentEpisodes(setup_of(source, timeout_seconds=1.0), [{}]) as episodes:
        with pytest.raises(GRPOError, match=message) as failed:
            episodes.step({0: "x"})
    assert failed.value.code == "environment_error"


@needs_sandbox
def test_an_environment_that_does_not_load_fails_at_its_start() -> None:
    source = "raise RuntimeError('broken')\nclass Environment:\n    def reset(self, item): pass\n" \
             "    def step(self, action): pass\n"
    with pytest.raises(GRPOError, match="does not load: RuntimeError: broken") as failed:
        EnvironmentEpisodes(setup_of(source), [{}, {}])
    assert failed.value.code == "environment_error"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model fitted to end its turn at once (EOS after any context), so that episodes
    take the turns their environment asks for rather than run out of tokens in the first."""
    model, tokenizer = with_tool_tokens(tmp_path_factory.mktemp("tiny"))
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        ids = torch.randint(3, len(tokenizer), (8, 48), generator=generator)
        model(input_ids=ids, labels=torch.full_like(ids, tokenizer.eos_token_id)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), tokenizer


def run(model, tokenizer, items, environment: EnvironmentSetup, max_new=40, trajectory=1024):
    conversations = Conversations(tokenizer, None)
    setup = AgentSetup(conversations, None, Limits(), None, trajectory, environment, max_prompt_length=256)
    rows = [{**item, "prompt": [{"role": "user", "content": f"Play {i}."}]} for i, item in enumerate(items)]
    texts = [conversations.prompt_text(row["prompt"]) for row in rows]
    prompts = tokenize_prompts(tokenizer, texts, 256, torch.device("cpu"))
    eos = torch.tensor([tokenizer.eos_token_id])
    result = sample_episodes(model, prompts, [True] * len(items), 2, eos, tokenizer, SamplingOptions(max_new),
                             row_keys(5, torch.arange(len(items)), 2), setup, ReasoningSpec(), items=rows)
    return conversations, rows, result


@needs_sandbox
def test_episodes_act_in_their_environment_until_done_with_observations_masked_out(tiny) -> None:
    model, tokenizer = tiny
    conversations, rows, (rollout, decoded, stats) = run(
        model, tokenizer, [{"turns": 2, "greet": True}, {"turns": 9}], setup_of(max_turns=3))
    # The first prompt's episodes were told to take 2 turns (and took 2); the second's stop at max_turns.
    assert stats.turns == [2, 2, 3, 3] and stats.env_rewards == [1.0, 1.0, 1.5, 1.5]
    assert [m["reward"] for m in stats.messages[0] if m["role"] == "assistant"] == [0.5, 0.5]
    assert stats.messages[0][1] == {"role": "user", "content": "turn 1 of 2, instances 1"}
    greeted = conversations.prompt_text(with_observation(rows[0]["prompt"], "Take 2 turns."))
    assert rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist() == tokenizer(
        greeted, add_special_tokens=False)["input_ids"]
    for row in range(4):
        turns = stats.turns[row]
        ids = rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()
        model_tokens = rollout.model_mask[row][rollout.completion_mask[row].bool()].tolist()
        observations = [conversations.observation_ids([{"role": "user", "content": m["content"]}], chat=True)
                        for m in stats.messages[row] if m["role"] == "user"][: turns - 1]
        # Every observation's tokens are in the trajectory as rendered, none of them the model's.
        assert len(ids) - sum(model_tokens) == sum(len(o) for o in observations)
        at = 0
        for observation in observations:
            start = model_tokens.index(0, at)
            assert ids[start:start + len(observation)] == observation
            at = start + len(observation)
    assert episode_metrics(stats.rows())["env_reward/mean"] == 1.25
    # The answer is the last turn's text (its observation follows it).
    assert decoded[0].answer == stats.messages[0][-2]["content"]


@needs_sandbox
def test_every_model_token_of_an_episode_is_scored_in_its_sampling_context(tiny) -> None:
    model, tokenizer = tiny
    _, _, (rollout, _, stats) = run(model, tokenizer, [{"turns": 3, "greet": True}], setup_of(max_turns=3),
                                    max_new=30)
    assert stats.turns == [3, 3]
    with torch.no_grad():
        # What the update computes: each prompt once for its G trajectories.
        assert prompt_owners(rollout.prompt_ids, rollout.prompt_mask) is not None
        batched, _ = rollout_logprobs(model, rollout)
    for row in range(2):
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        tokens = rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()
        for t, sampled in enumerate(rollout.model_mask[row][: len(tokens)].tolist()):
            if sampled:
                context = torch.tensor([prompt + tokens[: t + 1]])
                with torch.no_grad():
                    alone, _ = completion_logprobs(model, context, torch.ones_like(context), 1)
                assert torch.allclose(batched[row, t], alone[0, 0], atol=1e-5), (row, t)


@needs_sandbox
def test_the_token_budgets_end_an_environment_episode_as_truncated(tiny) -> None:
    model, tokenizer = tiny
    # Each turn is a token or two (the model ends its turns at once): 2 model tokens run out first.
    _, _, (rollout, _, stats) = run(model, tokenizer, [{"turns": 5}], setup_of(max_turns=5), max_new=2)
    assert rollout.is_truncated.all() and rollout.model_mask.sum(dim=1).tolist() == [2, 2]
    assert max(stats.turns) <= 2
    # The trajectory's bound: no room for an observation and a turn after the first turn.
    prompt = int(rollout.prompt_mask.sum(dim=1).max())
    _, _, (rollout, _, stats) = run(model, tokenizer, [{"turns": 5}], setup_of(max_turns=5), max_new=40,
                                    trajectory=prompt + 4)
    assert rollout.is_truncated.all() and stats.turns == [1, 1]


ESCAPES = '''
import socket, subprocess


class Environment:
    def reset(self, item):
        return None

    def step(self, action):
        tried = {}
        for name, attempt in (
            ("host files", lambda: open("/etc/passwd").read()),
            ("network", lambda: socket.create_connection(("127.0.0.1", 5432), timeout=1)),
            ("a program", lambda: subprocess.run(["/bin/sh", "-c", "true"])),
            ("writing the root", lambda: open("/escaped", "w").write("x")),
        ):
            try:
                attempt()
                tried[name] = "reached"
            except BaseException as exc:
                tried[name] = type(exc).__name__
        return {"observation": repr(tried), "reward": 0.0, "done": True}
'''


@needs_sandbox
def test_an_environment_runs_inside_the_sandbox_the_graders_use() -> None:
    """The escape suite's main doors, tried from an episode: no host file, no network, no other
    program, no writing outside its /tmp (tests/grpo_core/test_sandbox_escapes.py tries the rest
    against the same sandbox)."""
    with EnvironmentEpisodes(setup_of(ESCAPES), [{}]) as episodes:
        tried = episodes.step({0: "x"})[0].observation
    assert "reached" not in tried, tried
    assert "host files" in tried and "network" in tried


@needs_sandbox
def test_many_episodes_share_sandboxes_by_batches_each_in_its_own_process() -> None:
    """More episodes than one sandbox forks: every one still has its own Environment (the
    instance count each sees is 1), and an episode ended early leaves the others running."""
    from grpo_core.agents.environment_runner import EPISODES_PER_SANDBOX

    count = EPISODES_PER_SANDBOX + 3
    with EnvironmentEpisodes(setup_of(), [{"turns": 2}] * count) as episodes:
        first = episodes.step({i: "a" for i in range(count)})
        assert [first[i].observation for i in range(count)] == ["turn 1 of 2, instances 1"] * count
        episodes.finish(0)
        episodes.finish(EPISODES_PER_SANDBOX)
        second = episodes.step({i: "b" for i in range(1, count) if i != EPISODES_PER_SANDBOX})
        assert all(result.done for result in second.values()) and len(second) == count - 2


# An environment whose step runs the action as a program and answers with what it printed: the
# escape suite's attacks (tests/grpo_core/test_sandbox_escapes.py) made from inside an episode.
ATTACKER = '''
import contextlib, io


class Environment:
    def reset(self, item):
        return None

    def step(self, action):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(action, {})
        return {"observation": printed.getvalue(), "done": False}
'''


@needs_sandbox
def test_the_escape_suites_attacks_are_contained_inside_an_episode() -> None:
    from sandbox_processes import processes_in

    ptrace = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "print('attach', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n")
    memory = ("try:\n    open('/proc/1/mem', 'r+b').write(b'x')\n    print('wrote')\n"
              "except OSError as exc:\n    print('refused', exc.errno)\n")
    daemon = ("import os, time\nprint(os.readlink('/proc/self/ns/pid'))\n"
              "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
              "    os._exit(0)\n")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        network = ("import socket\ntry:\n"
                   f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
                   "except OSError as exc:\n    print('refused', exc.errno)\n")
        with EnvironmentEpisodes(setup_of(ATTACKER, timeout_seconds=5.0), [{}] * 4) as episodes:
            seen = episodes.step({0: ptrace, 1: memory, 2: network, 3: daemon})
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached it
    assert seen[0].observation.split()[:2] == ["attach", "-1"]
    assert seen[1].observation.startswith("refused") and seen[2].observation.startswith("refused")
    namespace = seen[3].observation.split()[0]
    assert processes_in(namespace) == []  # the daemon ended with its episodes' sandbox
