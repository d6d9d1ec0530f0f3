"""reward_model with tiny random-init sequence classifiers built locally: its scores equal a plain
forward of the same model on each text alone (so batching, padding and truncation change nothing),
it loads once in eval mode without gradients, and bad args or folders name their field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reward_helpers import fresh_registry, spec_error  # noqa: F401 - autouse fixture
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from grpo_core.errors import SourceUnavailable
from grpo_core.io.tiny_models import build_tiny_model
from grpo_core.rewards import RewardContext, bind_rewards, score_completions
from grpo_core.spec.run_spec import RewardSpec

PROMPTS = ["What is 2+3?", "Is it good?", "hello world", "Think about the number seven.", "one"]
ANSWERS = ["The answer is 5.", "yes", "no no no no no no no maybe", "7", "two three four five six"]


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_tiny_model(root / "rm-qwen2", family="qwen2", num_labels=1, seed=1)
    build_tiny_model(root / "rm-llama", family="llama", num_labels=2, seed=2)
    build_tiny_model(root / "policy", family="llama")
    return root


def reward(models_root: Path, **args) -> object:
    spec = RewardSpec(name="reward_model", args={"model": "path:rm-qwen2", **args})
    return bind_rewards([spec], RewardContext(models_root=models_root))[0]


def direct_scores(folder: Path, texts: list[str], logit_index: int = 0,
                  keep_last: int | None = None) -> list[float]:
    """Each text alone through a freshly loaded copy of the model: no padding, no batching."""
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            ids = ids if keep_last is None else ids[:, -keep_last:]
            out.append(model(input_ids=ids).logits[0, logit_index].item())
    return out


@pytest.mark.parametrize(("folder", "logit_index"), [("rm-qwen2", 0), ("rm-llama", 1), ("rm-llama", 0)])
def test_scores_equal_a_direct_forward_of_each_text(models_root: Path, folder: str, logit_index: int):
    spec = RewardSpec(name="reward_model", args={"model": f"path:{folder}", "batch_size": 2,
                                                   "logit_index": logit_index})
    bound = bind_rewards([spec], RewardContext(models_root=models_root))
    matrix = score_completions(bound, ANSWERS, PROMPTS, {}).matrix
    expected = direct_scores(models_root / folder, [p + a for p, a in zip(PROMPTS, ANSWERS, strict=True)],
                             logit_index)
    assert [row[0] for row in matrix] == pytest.approx(expected, abs=1e-5)


def test_chat_prompts_go_through_the_reward_tokenizers_template(models_root: Path):
    messages = [[{"role": "system", "content": "Be short."}, {"role": "user", "content": p}] for p in PROMPTS]
    scores = reward(models_root, batch_size=3).fn(ANSWERS, ["rendered"] * 5, prompt_messages=messages)
    tokenizer = AutoTokenizer.from_pretrained(models_root / "rm-qwen2")
    texts = [tokenizer.apply_chat_template([*m, {"role": "assistant", "content": a}], tokenize=False)
             for m, a in zip(messages, ANSWERS, strict=True)]
    assert texts[0] == "<system>Be short.\n<user>What is 2+3?\n<assistant>The answer is 5.\n"
    assert scores == pytest.approx(direct_scores(models_root / "rm-qwen2", texts), abs=1e-5)


def test_long_texts_keep_their_end(models_root: Path):
    scores = reward(models_root, max_length=8, batch_size=5).fn(ANSWERS, PROMPTS)
    texts = [p + a for p, a in zip(PROMPTS, ANSWERS, strict=True)]
    assert scores == pytest.approx(direct_scores(models_root / "rm-qwen2", texts, keep_last=8), abs=1e-5)


def test_raw_completions_are_scored_when_asked(models_root: Path):
    raw = ["<think>hmm</think>" + a for a in ANSWERS]
    scores = reward(models_root, completion="raw").fn(ANSWERS, PROMPTS, raw_completions=raw)
    texts = [p + r for p, r in zip(PROMPTS, raw, strict=True)]
    assert scores == pytest.approx(direct_scores(models_root / "rm-qwen2", texts), abs=1e-5)


def test_loaded_once_in_eval_mode_without_gradients(models_root: Path, monkeypatch: pytest.MonkeyPatch):
    loads = []
    original = AutoModelForSequenceClassification.from_pretrained

    def counting(*args, **kwargs):
        loads.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", counting)
    scorer = bind_rewards([RewardSpec(name="reward_model", args={"model": "path:rm-qwen2"})],
                          RewardContext(models_root=models_root, dtype="bfloat16"))[0].fn
    first, second = scorer(ANSWERS, PROMPTS), scorer(ANSWERS, PROMPTS)
    assert len(loads) == 1 and first == second
    assert not scorer.model.training
    assert all(not p.requires_grad for p in scorer.model.parameters())
    assert next(scorer.model.parameters()).dtype == torch.bfloat16  # the job's dtype
    assert scorer.model.config.pad_token_id == scorer.tokenizer.pad_token_id
    assert scorer.tokenizer.padding_side == "right"


def test_bad_models_and_args_name_their_field(models_root: Path):
    def error(**args):
        return spec_error([RewardSpec(name="reward_model", args=args)], models_root=models_root)

    causal = error(model="path:policy")
    assert causal.field == "rewards.0.args.model" and "not a sequence classifier" in causal.reason
    missing = error(model="path:nowhere")
    assert isinstance(missing, SourceUnavailable) and missing.field == "rewards.0.args.model"
    assert error(model="path:../outside").field == "rewards.0.args.model"
    assert error(model="job:3").field == "rewards.0.args.model"
    assert error(model="path:rm-qwen2", logit_index=1).field == "rewards.0.args.logit_index"
    assert error(model="path:rm-qwen2", batch_size=0).field == "rewards.0.args.batch_size"
    assert error().field == "rewards.0.args.model"


def test_rewards_get_each_completions_prompt_messages_from_the_rows():
    from grpo_core.io.prompt_data import PromptSet

    chat = [{"role": "user", "content": "hi"}]
    prompts = PromptSet([{"prompt": "plain"}, {"prompt": chat}], ["plain", "<user>hi\n<assistant>"])
    assert prompts.prompt_messages([1, 0], 2) == [chat, chat, None, None]
