"""Evaluation at the service's edges, on a real tiny job run by the real task (supervisor and job
process): each eval point's record, as SQL holds it, leaves one ``job.eval`` delivery per webhook
that wants it, with the step and exactly its eval metrics, and its ``job.succeeded`` delivery
carries the last step's record, the last eval point's metrics and its model's download path; and
the exported model's card states the last eval point (the final step) apart from the training
metrics."""

from __future__ import annotations

from cryptography.fernet import Fernet
from sqlalchemy import select
from test_final_model import run_to_the_end

from api.artifacts.paths import model_dir
from api.security.secret_box import SecretBox
from api.store.db import session_scope
from api.store.tables import JobMetric, WebhookDelivery
from api.store.webhooks import create_webhook

# What an eval point adds to its step's record with one reward, contains (all and only these).
EVAL_NAMES = ("eval_reward", "eval_reward_std", "eval_pass@k", "eval_rewards/contains/mean",
              "eval_rewards/contains/std", "eval_completions/mean_length", "eval_completions/min_length",
              "eval_completions/max_length", "eval_completions/clipped_ratio",
              "eval_completions/mean_terminated_length", "timing/eval")
EVAL_PROMPTS = [{"prompt": "Say yes."}, {"prompt": "Is it yes?"}, {"prompt": "no"}]


def test_an_evaluating_job_announces_each_eval_point_and_its_card_states_the_last(
        task_settings, submit, tiny_spec, database_url, team_id) -> None:
    box = SecretBox(Fernet.generate_key().decode())
    with session_scope(database_url) as session:
        hook = create_webhook(session, team_id, "https://hooks.example.com/grpo", ["job.eval"], box, 2)
        endings_only = create_webhook(session, team_id, "https://hooks.example.com/end", ["job.succeeded"],
                                      box, 2)
    grpo = {"eval_strategy": "steps", "eval_steps": 2, "eval_on_start": True, "eval_num_generations": 2}
    job_id = submit(tiny_spec("evaluated", max_steps=3, checkpoint_every=3, grpo=grpo,
                              eval_dataset={"prompts": EVAL_PROMPTS}))
    run_to_the_end(database_url, job_id)

    with session_scope(database_url) as session:
        # The rows themselves: list_metrics reads after a step, from 0, which leaves out step 0.
        records = {row.step: row.payload for row in session.scalars(select(JobMetric).where(
            JobMetric.job_id == job_id))}
        sent = session.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
                               .order_by(WebhookDelivery.id)).all()
        payloads = [(d.webhook_id, d.event, d.payload) for d in sent]
    # On start, every eval_steps, and the final step.
    assert sorted(step for step, values in records.items() if "eval_reward" in values) == [0, 2, 3]
    eval_points = [(webhook, p["data"]["step"]) for webhook, event, p in payloads if event == "job.eval"]
    assert eval_points == [(hook.id, 0), (hook.id, 2), (hook.id, 3)]
    assert [webhook for webhook, event, _ in payloads if event != "job.eval"] == [endings_only.id]
    for _, event, payload in payloads:
        if event == "job.eval":
            step = payload["data"]["step"]
            assert payload["data"]["metrics"] == {name: records[step][name] for name in EVAL_NAMES}, step
            assert payload["data"]["job"] == {"id": job_id, "name": "evaluated", "team_id": team_id}
    # The ending tells how the job ended: its last step, its last eval point, where its model is.
    [ended] = [payload["data"] for _, event, payload in payloads if event == "job.succeeded"]
    assert ended["metrics"] == {"step": 3, "values": records[3]}
    assert ended["eval_metrics"] == {"step": 3, "values": {name: records[3][name] for name in EVAL_NAMES}}
    assert ended["model_download_path"] == f"/v1/jobs/{job_id}/model"

    card = (model_dir(task_settings, job_id) / "README.md").read_text()
    trained, _, rest = card.partition("## Evaluation at step 3")
    assert "## Metrics at step 3" in trained and f"| reward | {records[3]['reward']:.6g} |" in trained
    assert "eval_reward" not in trained  # the eval figures have their own section
    assert "On 3 eval prompts, 2 completion(s) per prompt, greedy; a prompt passes" in rest
    for name in ("eval_reward", "eval_pass@k", "eval_rewards/contains/mean"):
        assert f"| {name} | {records[3][name]:.6g} |" in rest, name
