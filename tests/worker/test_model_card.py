"""The model card a real job leaves (the Celery task: supervisor and job process) is fit to
publish: the Hub's YAML metadata, the rewards by name and weight, and neither the team's grader
source nor a ``path:`` name on the server; ``export.card_includes_rewards`` puts the rewards'
full definitions in for a team that wants them."""

from __future__ import annotations

import json

import yaml
from sandbox_guard import needs_sandbox
from test_reward_failures import run_task

from api.artifacts.paths import model_dir

PROMPTS = [{"prompt": "Say yes."}, {"prompt": "Say no."}]

pytestmark = needs_sandbox

GRADER = ("def grade(sample, item):\n    # team-secret-rubric\n"
          "    return 1.0 if 'yes' in sample['output_text'] else 0.0\n")


def card_of(task_settings, submit, tiny_spec, database_url, roots, **fields) -> str:
    (roots["data"] / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    rewards = [{"name": "python", "args": {"source": GRADER}, "weight": 2.0},
               {"name": "contains", "args": {"text": "yes"}}]
    job_id = submit(tiny_spec("carded", max_steps=1, rewards=rewards,
                              dataset={"source": "path:prompts.jsonl"}, **fields))
    assert run_task(database_url, job_id) == "succeeded"
    return (model_dir(task_settings, job_id) / "README.md").read_text()


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_a_card_leaves_out_the_grader_and_server_paths_and_carries_hub_metadata(
        task_settings, submit, tiny_spec, database_url, roots) -> None:
    card = card_of(task_settings, submit, tiny_spec, database_url, roots)
    assert "team-secret-rubric" not in card and "def grade" not in card
    assert "path:" not in card and "prompts.jsonl" not in card and "tiny" not in card
    header = front_matter(card)
    assert header["library_name"] == "transformers" and header["tags"][0] == "grpo"
    assert "| python | 2 |" in card and "| contains | 1 |" in card  # the rewards by name and weight


def test_a_card_with_card_includes_rewards_has_the_full_definitions(task_settings, submit, tiny_spec,
                                                                   database_url, roots) -> None:
    card = card_of(task_settings, submit, tiny_spec, database_url, roots,
                   export={"card_includes_rewards": True})
    spec = yaml.safe_load(card.split("```yaml\n")[1].split("```")[0])
    assert spec["rewards"][0]["args"]["source"] == GRADER
    assert spec["rewards"][1]["args"]["text"] == "yes"
    assert "path:" not in card  # still no server path
