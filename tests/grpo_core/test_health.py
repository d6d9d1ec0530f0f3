"""The health rules (issue 37 item 1) on hand-made metric records: each rule trips on metrics that
show its problem and stays quiet on metrics that do not; a tripped rule is quiet while its
condition holds and armed again once it clears; overrides and ``off``; the watch's state survives
a JSON round trip (the checkpoint) and goes on where it was."""

from __future__ import annotations

import json
import math

import pytest

from grpo_core.run.health import HealthWatch, strongest
from grpo_core.spec.alerts import ALERT_RULES, DEFAULTS, AlertSpec, resolved_rules
from grpo_core.spec.run_spec import RunSpec


def watch(**overrides: dict) -> HealthWatch:
    """Only the rules named, with their overrides (every other rule off)."""
    return HealthWatch(whole_specs(overrides))


def feed(w: HealthWatch, records: list[dict]) -> list[tuple[int, str]]:
    """``(step, rule)`` of every alert, the records numbered from step 1."""
    tripped = []
    for step, record in enumerate(records, start=1):
        tripped += [(alert.step, alert.rule) for alert in w.observe({"step": step, **record})]
    return tripped


def test_entropy_collapse_against_the_early_value() -> None:
    healthy = [{"entropy": 2.0}] * 3 + [{"entropy": 1.5}] * 10  # fell, but not below 0.5 x 2.0
    assert feed(watch(entropy_collapse={"threshold": 0.5, "window": 3}), healthy) == []
    collapsed = [{"entropy": 2.0}] * 3 + [{"entropy": 0.5}] * 5
    # Early value 2.0 from steps 1-3; below 1.0 from step 4; three steps in a row at step 6.
    tripped = feed(watch(entropy_collapse={"threshold": 0.5, "window": 3}), collapsed)
    assert tripped == [(6, "entropy_collapse")]


def test_kl_blowup_above_its_threshold_or_its_running_median() -> None:
    rule = {"kl_blowup": {"threshold": 0.5, "window": 4}}
    assert feed(watch(**rule), [{"kl": 0.01 * (1 + i % 3)} for i in range(20)]) == []
    assert feed(watch(**rule), [{"kl": 0.01}] * 3 + [{"kl": 0.9}]) == [(4, "kl_blowup")]
    # Under the threshold, but 20x the median of the previous four steps.
    assert feed(watch(**rule), [{"kl": 0.01}] * 4 + [{"kl": 0.2}]) == [(5, "kl_blowup")]
    # A multiple of the median needs a full window of history first.
    assert feed(watch(**rule), [{"kl": 0.01}] * 2 + [{"kl": 0.2}]) == []
    assert feed(watch(**rule), [{"kl": 0.01}, {"kl": math.inf}]) == [(2, "kl_blowup")]
    # beta 0 records no KL: nothing to judge.
    assert feed(watch(**rule), [{"reward": 1.0}] * 5) == []


@pytest.mark.parametrize(("rule", "metric", "bad", "good"), [
    ("no_signal", "frac_reward_zero_std", 1.0, 0.5),
    ("length_runaway", "completions/clipped_ratio", 0.9, 0.2),
    ("grader_failures", "rewards/unscored_ratio", 0.5, 0.0),
])
def test_fraction_rules_need_their_whole_window(rule: str, metric: str, bad: float, good: float) -> None:
    window = 3
    w = watch(**{rule: {"window": window}})
    assert feed(w, [{metric: good}] * 10) == []
    # Broken by a good step before the window fills: no alert.
    assert feed(watch(**{rule: {"window": window}}), [{metric: bad}, {metric: bad}, {metric: good}] * 3) == []
    assert feed(watch(**{rule: {"window": window}}), [{metric: bad}] * 5) == [(3, rule)]


def test_no_signal_counts_a_fraction_equal_to_its_threshold() -> None:
    assert feed(watch(no_signal={"threshold": 0.95, "window": 2}), [{"frac_reward_zero_std": 0.95}] * 2) \
        == [(2, "no_signal")]


def test_reward_hacking_needs_training_up_and_eval_down() -> None:
    def run(train: list[float], evals: list[float], threshold: float = 0.0) -> list[tuple[int, str]]:
        # Two training steps per evaluation; the eval reward is on every second record.
        records = []
        for t, e in zip(train, evals, strict=True):
            records += [{"reward": t - 0.01}, {"reward": t + 0.01, "eval_reward": e}]
        return feed(watch(reward_hacking={"window": 3, "threshold": threshold}), records)

    assert run([0.1, 0.2, 0.3], [0.5, 0.4, 0.3]) == [(6, "reward_hacking")]
    assert run([0.1, 0.2, 0.3], [0.3, 0.4, 0.5]) == []  # both improving: learning
    assert run([0.3, 0.2, 0.1], [0.5, 0.4, 0.3]) == []  # both falling: sick, not hacking
    assert run([0.1, 0.2, 0.3], [0.5, 0.4, 0.3], threshold=0.5) == []  # fell 0.2, not over 0.5
    # An eval point before any training (step 0) is not a point of the trend.
    w = watch(reward_hacking={"window": 2})
    assert w.observe({"step": 0, "eval_reward": 1.0}) == []
    assert w.state["reward_hacking"].get("points") is None


def test_grad_explosion_on_a_non_finite_norm_or_a_jump() -> None:
    rule = {"grad_explosion": {"window": 3}}
    assert feed(watch(**rule), [{"grad_norm": 1.0 + 0.1 * (i % 4)} for i in range(20)]) == []
    assert feed(watch(**rule), [{"grad_norm": 1.0}, {"grad_norm": math.nan}]) == [(2, "grad_explosion")]
    assert feed(watch(**rule), [{"grad_norm": 1.0}] * 3 + [{"grad_norm": 50.0}]) == [(4, "grad_explosion")]
    # With a threshold, above it at once.
    assert feed(watch(grad_explosion={"threshold": 5.0}), [{"grad_norm": 6.0}]) == [(1, "grad_explosion")]


def test_a_tripped_rule_is_quiet_until_it_clears_then_told_again() -> None:
    w = watch(no_signal={"window": 2, "action": "pause"})
    bad, good = {"frac_reward_zero_std": 1.0}, {"frac_reward_zero_std": 0.0}
    assert feed(w, [bad] * 6 + [good] + [bad] * 2) == [(2, "no_signal"), (9, "no_signal")]


def test_the_watch_goes_on_where_its_saved_state_left_it() -> None:
    rules = {"no_signal": {"window": 5}, "kl_blowup": {}, "entropy_collapse": {}}
    whole = watch(**rules)
    for step in range(1, 5):
        assert whole.observe({"step": step, "frac_reward_zero_std": 1.0, "kl": 0.01, "entropy": 1.0}) == []
    saved = json.loads(json.dumps(whole.state_dict()))  # as the checkpoint's trainer state keeps it
    resumed = HealthWatch(whole_specs(rules), saved)
    assert [a.rule for a in resumed.observe({"step": 5, "frac_reward_zero_std": 1.0})] == ["no_signal"]
    assert HealthWatch(whole_specs(rules)).observe({"step": 5, "frac_reward_zero_std": 1.0}) == []


def whole_specs(overrides: dict[str, dict]) -> list[AlertSpec]:
    return [AlertSpec(rule=rule, **({"action": "off"} if rule not in overrides else overrides[rule]))
            for rule in ALERT_RULES]


def test_defaults_overrides_and_off() -> None:
    rules = {rule.rule: rule for rule in resolved_rules([AlertSpec(rule="kl_blowup", action="stop"),
                                                        AlertSpec(rule="no_signal", action="off")])}
    assert "no_signal" not in rules
    assert rules["kl_blowup"].action == "stop"
    assert rules["kl_blowup"].threshold == DEFAULTS["kl_blowup"].threshold
    assert all(rules[name].action == "notify" for name in rules if name != "kl_blowup")
    # The defaults are quiet on a healthy run's records.
    healthy = [{"entropy": 1.0, "kl": 0.01, "frac_reward_zero_std": 0.3, "completions/clipped_ratio": 0.1,
                "rewards/unscored_ratio": 0.0, "grad_norm": 1.0, "reward": 0.5} for _ in range(50)]
    assert feed(HealthWatch([]), healthy) == []


def test_strongest_action_wins_among_alerts_of_one_step() -> None:
    w = watch(no_signal={"window": 1, "action": "pause"}, length_runaway={"window": 1, "action": "stop"},
              grader_failures={"window": 1})
    alerts = w.observe({"step": 1, "frac_reward_zero_std": 1.0, "completions/clipped_ratio": 1.0,
                        "rewards/unscored_ratio": 1.0})
    assert [a.rule for a in alerts] == ["no_signal", "length_runaway", "grader_failures"]
    assert strongest(alerts).rule == "length_runaway"
    assert strongest([a for a in alerts if a.action == "notify"]) is None


def test_a_spec_lists_each_rule_once(tiny_model_dir) -> None:
    from core_specs import spec_dict

    spec = spec_dict(tiny_model_dir)
    spec["alerts"] = [{"rule": "kl_blowup", "action": "pause"}, {"rule": "kl_blowup", "threshold": 2}]
    with pytest.raises(ValueError, match="listed twice"):
        RunSpec.model_validate(spec)
    spec["alerts"] = [{"rule": "kl_blowup", "action": "explode"}]
    with pytest.raises(ValueError, match="action"):
        RunSpec.model_validate(spec)


def test_the_trainer_acts_on_a_rule_and_a_resume_goes_on(tiny_model_dir, tmp_path) -> None:
    """Through the real trainer: a notify rule tells and trains on; a pausing rule ends the run
    after its step's checkpoint; resumed from it, the rule (still tripped) does not end it again."""
    from core_specs import spec_dict
    from test_best_model import EventLog

    from grpo_core.run.components import build_components
    from grpo_core.run.trainer import GRPOTrainer

    spec = spec_dict(tiny_model_dir, max_steps=3)
    # frac_reward_zero_std >= 0 always holds: the rule trips at step 1 and stays tripped.
    spec["alerts"] = [{"rule": "no_signal", "threshold": 0.0, "window": 1, "action": "notify"},
                      {"rule": "kl_blowup", "threshold": 1e9, "action": "stop"}]
    told = EventLog()
    result = GRPOTrainer(build_components(RunSpec.model_validate(spec), device="cpu"), tmp_path / "a",
                         told).train()
    assert result.step == 3 and result.alert is None and not result.stopped
    alerts = [data for kind, data in told.data if kind == "alert"]
    assert [(a["rule"], a["step"], a["action"]) for a in alerts] == [("no_signal", 1, "notify")]
    assert all("rewards/unscored_ratio" in record for record in told.records)

    spec["alerts"][0]["action"] = "pause"
    paused_log = EventLog()
    paused = GRPOTrainer(build_components(RunSpec.model_validate(spec), device="cpu"), tmp_path / "b",
                         paused_log).train()
    assert paused.stopped and paused.step == 1 and paused.alert.rule == "no_signal"
    assert paused.checkpoint == tmp_path / "b" / "step-1" and paused.checkpoint.is_dir()
    assert paused_log.events[-1] == "stopped"

    resumed_log = EventLog()
    trainer = GRPOTrainer(build_components(RunSpec.model_validate(spec), device="cpu"), tmp_path / "b",
                          resumed_log)
    assert trainer.resume()
    again = trainer.train()
    assert again.step == 3 and again.alert is None
    assert "alert" not in resumed_log.events


def test_every_rule_is_explained_with_its_defaults() -> None:
    from api.domain.explanations import ALERT_RULES as EXPLAINED
    from api.domain.explanations import ERROR_CODES
    from grpo_core.spec.alerts import MEDIAN_MULTIPLE

    assert tuple(EXPLAINED) == ALERT_RULES
    for rule, default in DEFAULTS.items():
        if default.threshold is not None:
            assert f"default {default.threshold:g}" in EXPLAINED[rule] or default.threshold == 0, rule
        assert rule in ERROR_CODES  # a stopping rule's code
    for rule in ("kl_blowup", "grad_explosion"):
        assert f"{MEDIAN_MULTIPLE:g}x its median" in EXPLAINED[rule]
