"""Continuing from a job over real HTTP (Postgres and SQLite): ``model.source: job:ID[@STEP]``
is checked at submit (the team's own job, which has that model now), and so is a reward's model
named so (a judge inside a ``multi``, a ``reward_model``), each named at its field; ``POST .../clone``
queues a job with the same spec, changed as asked, checked like any submission. The worker's
side (loading that model) is tested in tests/worker/test_final_model.py."""

from __future__ import annotations

import shutil
import uuid

from api.artifacts.paths import checkpoint_dir, model_dir
from api.store.db import session_scope
from api.store.telemetry import record_checkpoint


def submitted(client, spec) -> dict:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return response.json()


def refused(response, field: str = "model.source") -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == field, error
    return error["message"]


def test_a_job_source_must_be_the_teams_own_job_with_that_model(alpha, beta, job_spec, api_server,
                                                                tiny_model_dir) -> None:
    settings = api_server.settings
    done = submitted(alpha, job_spec())
    assert "has no final model or checkpoint yet" in refused(alpha.post("/v1/jobs", json=job_spec(
        model={"source": f"job:{done['id']}"})))
    shutil.copytree(tiny_model_dir, model_dir(settings, done["id"]))
    step_2 = checkpoint_dir(settings, done["id"]) / "step-2"
    shutil.copytree(tiny_model_dir, step_2)
    (step_2 / "trainer_state.json").write_text("{}")
    # A folder no row names is a stale attempt's (docs/architecture.md §3): not a source yet.
    assert "no checkpoint of step 2" in refused(alpha.post("/v1/jobs", json=job_spec(
        model={"source": f"job:{done['id']}@2"})))
    with session_scope(settings.database_url) as session:
        record_checkpoint(session, done["id"], 2, str(step_2), 1)

    for source in (f"job:{done['id']}", f"job:{done['id']}@2"):
        assert submitted(alpha, job_spec(model={"source": source}))["spec"]["model"]["source"] == source
    assert "no checkpoint of step 3" in refused(alpha.post("/v1/jobs", json=job_spec(
        model={"source": f"job:{done['id']}@3"})))
    assert f"your team has no job {done['id']}" in refused(beta.post("/v1/jobs", json=job_spec(
        model={"source": f"job:{done['id']}"})))
    for bad in ("job:abc", "job:0", "job:7@", "job:7@0", "job:-1"):
        assert "job:ID" in refused(alpha.post("/v1/jobs", json=job_spec(model={"source": bad})))
    assert "'job:' names a model" in refused(alpha.post("/v1/jobs", json=job_spec(
        dataset={"source": "job:1"})), "dataset.source")


def judged_by(model: str) -> list[dict]:
    """Rewards whose judge, inside a ``multi``, is ``model``."""
    judge = {"type": "label_model", "model": model, "labels": ["yes", "no"], "passing_labels": ["yes"],
             "input": [{"role": "user", "content": "Is {{sample.output_text}} right?"}]}
    return [{"name": "multi", "args": {"graders": {"judge": judge}, "calculate_output": "judge"}}]


def test_a_rewards_job_model_must_be_the_teams_own_job_with_that_model(alpha, beta, job_spec, api_server,
                                                                      tiny_model_dir) -> None:
    settings = api_server.settings
    judge = "rewards.0.args.graders.judge.model"
    done = submitted(alpha, job_spec())
    assert "has no final model or checkpoint yet" in refused(alpha.post("/v1/jobs", json=job_spec(
        rewards=judged_by(f"job:{done['id']}"))), judge)
    shutil.copytree(tiny_model_dir, model_dir(settings, done["id"]))

    accepted = submitted(alpha, job_spec(rewards=judged_by(f"job:{done['id']}")))
    assert accepted["spec"]["rewards"][0]["args"]["graders"]["judge"]["model"] == f"job:{done['id']}"
    reward_model = [{"name": "reward_model", "args": {"model": f"job:{done['id']}"}}]
    assert submitted(alpha, job_spec(rewards=reward_model))["spec"]["rewards"][0]["args"] == {
        "model": f"job:{done['id']}"}
    assert f"your team has no job {done['id']}" in refused(beta.post("/v1/jobs", json=job_spec(
        rewards=judged_by(f"job:{done['id']}"))), judge)
    assert "keeps no checkpoint of step 3" in refused(alpha.post("/v1/jobs", json=job_spec(
        rewards=judged_by(f"job:{done['id']}@3"))), judge)
    assert "job:ID" in refused(alpha.post("/v1/jobs", json=job_spec(rewards=judged_by("job:0"))), judge)
    # One root for every reward model: another job's beside the models root's is refused.
    mixed = [*judged_by(f"job:{done['id']}"), {"name": "reward_model", "args": {"model": "path:tiny"}}]
    assert "not both" in refused(alpha.post("/v1/jobs", json=job_spec(rewards=mixed)), "rewards.1.args.model")


def test_clone_queues_the_same_spec_changed_as_asked(alpha, beta, job_spec) -> None:
    original = submitted(alpha, job_spec(name="original"))
    jobs_before = alpha.get("/v1/jobs").json()["items"]
    draft = alpha.get(f"/v1/jobs/{original['id']}/clone")  # what a clone would get, nothing queued
    assert draft.status_code == 200 and draft.json() == {"spec": {**original["spec"], "name": "original-2"}}
    assert alpha.get("/v1/jobs").json()["items"] == jobs_before
    assert beta.get(f"/v1/jobs/{original['id']}/clone").status_code == 404
    same = alpha.post(f"/v1/jobs/{original['id']}/clone")
    assert same.status_code == 201 and same.json()["id"] != original["id"]
    assert same.json()["spec"] == {**original["spec"], "name": "original-2"}  # named apart, the rest the same
    assert same.json()["status"] == "queued"
    changes = {"name": "longer", "grpo": {"max_steps": 40}}
    changed = alpha.post(f"/v1/jobs/{original['id']}/clone", json=changes)
    assert changed.status_code == 201, changed.text
    spec = changed.json()["spec"]
    assert (spec["name"], spec["grpo"]["max_steps"], changed.json()["max_steps"]) == ("longer", 40, 40)
    assert spec["grpo"]["num_generations"] == original["spec"]["grpo"]["num_generations"]  # the rest kept

    assert "max_steps" in refused(alpha.post(f"/v1/jobs/{original['id']}/clone",
                                             json={"grpo": {"max_steps": 0}}), "grpo.max_steps")
    assert alpha.post(f"/v1/jobs/{original['id']}/clone", json=[1]).status_code == 422
    assert beta.post(f"/v1/jobs/{original['id']}/clone").status_code == 404


def test_grpo_clone_with_a_changes_file(alpha, job_spec, api_server, team_keys, tmp_path, capsys) -> None:
    from api.cli.main import main

    original = submitted(alpha, job_spec(name="to-clone"))
    changes = tmp_path / "changes.yaml"
    changes.write_text("name: cloned\ngrpo:\n  max_steps: 7\n")
    argv = ["clone", str(original["id"]), "--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    assert main([*argv, "--changes", str(changes)]) == 0
    assert f"(cloned), a clone of job {original['id']}: queued" in capsys.readouterr().out
    newest = alpha.get("/v1/jobs", params={"order": "desc", "limit": 1}).json()["items"][0]
    assert (newest["name"], newest["max_steps"]) == ("cloned", 7)
    changes.write_text("grpo:\n  max_steps: 0\n")
    assert main([*argv, "--changes", str(changes)]) == 2
    assert "grpo.max_steps" in capsys.readouterr().err


def test_a_clone_is_named_with_the_next_free_number_unless_named(alpha, beta, job_spec, api_server, team_keys,
                                                                 capsys) -> None:
    from api.cli.main import main

    def clone(job: dict, changes: dict | None = None) -> str:
        response = alpha.post(f"/v1/jobs/{job['id']}/clone", json=changes)
        assert response.status_code == 201, response.text
        assert response.json()["name"] == response.json()["spec"]["name"]
        return response.json()["name"]

    name = f"run-{uuid.uuid4().hex[:6]}"
    original = submitted(alpha, job_spec(name=name))
    submitted(beta, job_spec(name=f"{name}-7"))  # another team's names are not alpha's to count
    assert clone(original) == f"{name}-2"
    assert clone(original) == f"{name}-3"
    second = alpha.get("/v1/jobs", params={"order": "desc", "limit": 1}).json()["items"][0]
    assert clone(second) == f"{name}-4"  # a clone of a clone numbers on from its source's name
    assert clone(original, {"name": "named-here"}) == "named-here"
    argv = ["clone", str(original["id"]), "--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    capsys.readouterr()
    assert main(argv) == 0
    assert f"({name}-5), a clone of job {original['id']}" in capsys.readouterr().out

    # A name that ends in a number of its own keeps it when no job is called without it.
    numbered = submitted(alpha, job_spec(name=f"llama-3-{name}-8"))
    assert clone(numbered) == f"llama-3-{name}-8-2"
    longest = submitted(alpha, job_spec(name="x" * 128))
    assert clone(longest) == "x" * 126 + "-2"
