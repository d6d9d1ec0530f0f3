"""The reward catalog is the public documentation of rewards: every built-in has a description,
every args field a description and bounds, and the user's guide's reward table has a row for each."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.rewards import reward_catalog

USER_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user_guide.md"
BUILTINS = [reward for reward in reward_catalog() if reward["builtin"]]


@pytest.mark.parametrize("reward", BUILTINS, ids=[reward["name"] for reward in BUILTINS])
def test_every_builtin_describes_and_bounds_its_args(reward: dict):
    assert len(reward["description"]) > 20
    schema = reward["args_schema"]
    assert schema.get("additionalProperties") is False  # an unknown arg is an error, not ignored
    for name, prop in schema.get("properties", {}).items():
        assert prop.get("description"), f"{reward['name']}.{name} has no description"
        bounded = [option for option in [prop, *prop.get("anyOf", [])] if option.get("type") != "null"]
        for option in bounded:
            if option.get("type") == "string" and "enum" not in option:
                # A length, or an anchored pattern of bounded repeats (names such as a verifier's).
                anchored = option.get("pattern", "").endswith("}$")
                assert "maxLength" in option or anchored, f"{reward['name']}.{name} has no maxLength"
            if option.get("type") in ("integer", "number"):
                assert {"maximum", "exclusiveMaximum"} & set(option), f"{reward['name']}.{name} unbounded"
            if option.get("type") == "array":
                assert "maxItems" in option, f"{reward['name']}.{name} has no maxItems"


def test_the_user_guides_table_has_a_row_for_every_builtin():
    text = USER_GUIDE.read_text()
    missing = [reward["name"] for reward in BUILTINS if f"| `{reward['name']}` |" not in text]
    assert not missing, f"the user's guide's reward table lacks {missing}"
