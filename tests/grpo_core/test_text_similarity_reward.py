"""text_similarity against the libraries' own documented examples and direct calls."""

from __future__ import annotations

import pytest
from rapidfuzz import fuzz
from reward_helpers import bind_one, fresh_registry, run, spec_error  # noqa: F401 - autouse fixture
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from grpo_core.spec.run_spec import RewardSpec


def test_fuzzy_ratio_is_rapidfuzz_ratio_over_100():
    # rapidfuzz's documented example: fuzz.ratio("this is a test", "this is a test!") == 96.55...
    reward = bind_one("text_similarity", reference_field="ref", metric="fuzzy_ratio")
    scores = run(reward, ["this is a test!", "completely different"], ref=["this is a test"] * 2)
    assert scores[0] == pytest.approx(0.9655172413793104)
    assert scores[1] == pytest.approx(fuzz.ratio("completely different", "this is a test") / 100)


def test_bleu_is_sacrebleu_sentence_bleu_with_every_reference():
    hyp, refs = "The cat is on the mat.", ["The cat sat on the mat.", "There is a cat on the mat."]
    reward = bind_one("text_similarity", metric="bleu")
    scores = run(reward, [hyp, hyp], answer=[refs, refs[0]])
    direct = BLEU(effective_order=True)
    assert scores[0] == pytest.approx(direct.sentence_score(hyp, refs).score / 100)
    assert scores[1] == pytest.approx(direct.sentence_score(hyp, [refs[0]]).score / 100)
    exact = "The cat sat on the mat."
    assert run(reward, [exact], answer=[exact]) == [pytest.approx(1.0)]


def test_rouge_l_is_rouge_score_f1_of_the_best_reference():
    # rouge-score's README example: target first, prediction second.
    target = "The quick brown fox jumps over the lazy dog"
    prediction = "The quick brown dog jumps on the log."
    reward = bind_one("text_similarity")  # rouge_l on the answer column by default
    expected = rouge_scorer.RougeScorer(["rougeL"]).score(target, prediction)["rougeL"].fmeasure
    assert run(reward, [prediction], answer=[target]) == [pytest.approx(expected)]
    assert expected == pytest.approx(0.5882352941176471)
    assert run(reward, [prediction], answer=[["unrelated words", target]]) == [pytest.approx(expected)]


def test_scores_stay_in_unit_range_and_missing_references_are_unscorable():
    for metric in ("fuzzy_ratio", "bleu", "rouge_l"):
        reward = bind_one("text_similarity", metric=metric)
        scores = run(reward, ["abc def", "", "x"], answer=["abc def", "abc", None])
        assert scores[2] is None
        assert all(0.0 <= s <= 1.0 for s in scores[:2]) and scores[0] == pytest.approx(1.0)


def test_bad_args_name_their_field():
    error = spec_error([RewardSpec(name="text_similarity", args={"metric": "meteor"})])
    assert error.field == "rewards.0.args.metric"
    error = spec_error([RewardSpec(name="text_similarity", args={"reference_field": "gold"})], {"answer"})
    assert error.field == "rewards.0.args" and "gold" in error.reason
