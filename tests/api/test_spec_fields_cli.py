"""The spec where a CLI user looks: ``grpo show ID --spec`` prints it as YAML, ``grpo submit SPEC
--set PATH=VALUE`` and ``grpo clone ID --set ...`` change fields without a file (after any
``--changes``), through ``api.cli.main.main`` against the module's real server."""

from __future__ import annotations

import json

import pytest
import yaml

from api.cli.main import main


@pytest.fixture
def grpo(capsys, api_server, team_keys):
    """``grpo(*argv) -> (exit code, stdout, stderr)``, in-process, as team alpha."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*argv, "--api-url", api_server.http_url, "--api-key", team_keys.alpha])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def submitted(grpo, *argv: str) -> dict:
    code, out, err = grpo(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def shown_spec(grpo, job_id: int) -> dict:
    code, out, err = grpo("show", str(job_id), "--spec")
    assert code == 0, err
    return yaml.safe_load(out)


def test_show_spec_prints_the_stored_spec_as_yaml_in_its_order(grpo, client_for, team_keys, job_spec,
                                                                tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec(name="shown", dataset={"prompts": [
        {"prompt": "line one\nline two: yes"}, {"prompt": "Ünïcode #1"}]})))
    job = submitted(grpo, "submit", str(spec))
    stored = client_for(team_keys.alpha).get(f"/v1/jobs/{job['id']}").json()["spec"]
    code, out, err = grpo("show", str(job["id"]), "--spec")
    assert code == 0, err
    assert yaml.safe_load(out) == stored
    assert list(yaml.safe_load(out)) == list(stored)  # the service's field order, not sorted
    assert "Ünïcode #1" in out  # readable, not escaped
    code, out, err = grpo("show", str(job["id"]), "--spec", "--json")
    assert code == 0 and json.loads(out) == stored


def test_submit_set_changes_fields_of_the_file_before_it_is_sent(grpo, job_spec, tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec(name="from-file")))
    job = submitted(grpo, "submit", str(spec), "--set", "grpo.learning_rate=2e-6", "--set", "name=set-here",
                    "--set", "rewards.0.weight=2")
    stored = shown_spec(grpo, job["id"])
    assert job["name"] == stored["name"] == "set-here"
    assert stored["grpo"]["learning_rate"] == 2e-6
    assert stored["rewards"][0]["weight"] == 2
    assert yaml.safe_load(spec.read_text())["name"] == "from-file"  # the file itself is left alone


def test_clone_set_applies_after_the_changes_file(grpo, job_spec, tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec(name="original")))
    original = submitted(grpo, "submit", str(spec))
    before = shown_spec(grpo, original["id"])
    changes = tmp_path / "changes.yaml"
    changes.write_text(yaml.safe_dump({"name": "from-changes", "grpo": {"max_steps": 7, "seed": 3}}))
    clone = submitted(grpo, "clone", str(original["id"]), "--changes", str(changes),
                      "--set", "grpo.seed=5", "--set", "rewards.0.args.text='no'")
    after = shown_spec(grpo, clone["id"])
    assert after["name"] == "from-changes"
    assert after["grpo"] == {**before["grpo"], "max_steps": 7, "seed": 5}
    assert after["rewards"][0]["args"]["text"] == "no"
    assert after["rewards"][0]["weight"] == before["rewards"][0]["weight"]
    assert after["dataset"] == before["dataset"]
    code, out, err = grpo("clone", str(original["id"]), "--set", "grpo.learning_rate=1e-6")
    assert code == 0, err
    assert f"a clone of job {original['id']}" in out


def test_a_set_that_cannot_apply_or_names_no_field_is_refused(grpo, job_spec, tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec(name="refusals")))
    job = submitted(grpo, "submit", str(spec))
    with pytest.raises(SystemExit) as exited:  # argparse: the form is checked before anything runs
        grpo("submit", str(spec), "--set", "grpo.learning_rate")
    assert exited.value.code == 2
    code, _, err = grpo("submit", str(spec), "--set", "rewards.5.weight=1")
    assert code == 2 and "rewards.5 is not an index of a list of 1" in err
    code, _, err = grpo("clone", str(job["id"]), "--set", "name.first=x")
    assert code == 2 and "name is 'refusals', which has no field first" in err
    # A new field is the service's to judge: its 422 names it.
    code, _, err = grpo("clone", str(job["id"]), "--set", "grpo.no_such_field=1")
    assert code == 2 and "grpo.no_such_field" in err
    code, _, err = grpo("submit", str(spec), "--set", "grpo.no_such_field=1")
    assert code == 2 and "grpo.no_such_field" in err
