"""``--set PATH=VALUE`` (``api.cli.field_setting``): dotted paths into mappings and lists, values
read as YAML with JSON's numbers kept numbers, and the paths that cannot apply refused by name."""

from __future__ import annotations

import pytest

from api.cli.field_setting import FieldSettingError, parse_value, with_settings

SPEC = {"name": "base", "grpo": {"learning_rate": 1e-5, "max_steps": 10},
        "rewards": [{"name": "contains", "weight": 1.0, "args": {"text": "yes"}},
                    {"name": "length", "args": None}]}


@pytest.mark.parametrize(("raw", "value"), [
    ("2e-6", 2e-6), ("1E+3", 1000.0), ("-3", -3), ("0.5", 0.5), ("12", 12), ("true", True), ("null", None),
    ("", None), ("yes please", "yes please"), ("[a, 1]", ["a", 1]), ("{k: 2e-6}", {"k": "2e-6"}),
    ("'2e-6'", "2e-6"), (" 7 ", 7), ("no", False), ("'no'", "no"),
    ("inf", "inf"), ("0x10", 16), ("01", 1), ("1.", 1.0),
])
def test_a_value_is_yaml_with_json_numbers_read_as_numbers(raw: str, value: object) -> None:
    parsed = parse_value(raw)
    assert parsed == value and type(parsed) is type(value)


def test_dotted_paths_change_nested_fields_and_list_items_in_order() -> None:
    changed = with_settings(SPEC, ["grpo.learning_rate=2e-6", "rewards.0.weight=2", "name=again",
                                   "rewards.0.args.text='no'", "name=last"])
    assert changed["grpo"] == {"learning_rate": 2e-6, "max_steps": 10}
    assert changed["rewards"][0] == {"name": "contains", "weight": 2, "args": {"text": "no"}}
    assert changed["name"] == "last"
    assert SPEC["grpo"]["learning_rate"] == 1e-5 and SPEC["rewards"][0]["weight"] == 1.0  # a copy changed


def test_a_new_field_is_added_for_the_service_to_judge() -> None:
    changed = with_settings(SPEC, ["grpo.new_field=3", "lora.r=8", "rewards.1.args.min=4",
                                   "rewards.1.weight=0"])
    assert changed["grpo"]["new_field"] == 3
    assert changed["lora"] == {"r": 8}
    assert changed["rewards"][1] == {"name": "length", "args": {"min": 4}, "weight": 0}


def test_a_value_may_hold_an_equals_sign() -> None:
    assert with_settings(SPEC, ["rewards.0.args.text=a=b"])["rewards"][0]["args"]["text"] == "a=b"


@pytest.mark.parametrize(("setting", "named"), [
    ("grpo.learning_rate", "is not PATH=VALUE"),
    ("=3", "is not PATH=VALUE"),
    ("grpo..max_steps=3", "is not PATH=VALUE"),
    ("rewards.2.weight=1", "rewards.2 is not an index of a list of 2"),
    ("rewards.first.weight=1", "rewards.first is not an index of a list of 2"),
    ("name.first=x", "name is 'base', which has no field first"),
    ("grpo.max_steps.x=1", "grpo.max_steps is 10, which has no field x"),
    ("name=[unclosed", "is not a YAML value"),
])
def test_a_setting_that_cannot_apply_is_refused_by_name(setting: str, named: str) -> None:
    with pytest.raises(FieldSettingError, match=named.replace("[", r"\[").replace(".", r"\.")):
        with_settings(SPEC, [setting])
