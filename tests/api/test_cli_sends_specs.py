"""``grpo submit`` and ``grpo clone`` refuse nothing the API accepts: every example of
``examples/`` and a spec with ``file:`` sources, ``tags`` and a ``description`` go through the
CLI into the real API (a server of the module's database whose models root is ``examples/``, as
the examples' ``path:`` sources expect). A file that cannot be read or parsed, and a spec the
service's own ``JobSpec`` refuses, are told here before any API is called; every invalid field is
printed, one line each, whether found here or listed by the API (a clone's changes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_files import ROWS, model_archive, uploaded

from api.cli.dev import free_port
from api.cli.main import main
from grpo_core.rewards.sandbox import CAPABILITY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_SPECS = sorted(EXAMPLES.glob("*.yaml"))


@pytest.fixture
def grpo(capsys, team_keys):
    """``grpo(url, *argv) -> (exit code, stdout, stderr)``, in-process, as team alpha."""

    def run(url: str, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*argv, "--api-url", url, "--api-key", team_keys.alpha])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def sent(grpo, url: str, *argv: str) -> dict:
    code, out, err = grpo(url, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def written(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_there_are_examples() -> None:
    assert {path.name for path in EXAMPLE_SPECS} >= {"code.yaml", "math.yaml", "preference.yaml",
                                                     "python_grader.yaml", "tiny.yaml"}


def test_every_example_goes_through_the_cli(grpo, api_server, api_settings_factory, serve_api,
                                            advertise, client_for, team_keys) -> None:
    settings = api_settings_factory(api_server.settings.database_url, models_root=EXAMPLES)
    advertise("default", capabilities=(CAPABILITY,))  # code_tests and python need a sandbox somewhere
    with serve_api(settings) as server:
        alpha = client_for(team_keys.alpha, server)
        for path in EXAMPLE_SPECS:
            job = sent(grpo, server.http_url, "submit", str(path))
            assert job["status"] == "queued", path.name
            assert alpha.get(f"/v1/jobs/{job['id']}").json()["spec"]["name"] == yaml.safe_load(
                path.read_text())["name"]
            assert alpha.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200


def test_file_sources_tags_and_a_description_go_through_submit_set_and_clone(
        grpo, alpha, api_server, job_spec, tmp_path) -> None:
    url = api_server.http_url
    dataset = uploaded(alpha, "rows.jsonl", ROWS)["id"]
    model = uploaded(alpha, "tiny.tar.gz", model_archive(), "model")["id"]
    spec = written(tmp_path / "spec.yaml", job_spec(
        name="own-task", model={"source": f"file:{model}"}, dataset={"source": f"file:{dataset}"},
        tags=["own", "first-week"], description="our own task, uploaded"))
    job = sent(grpo, url, "submit", str(spec))
    stored = alpha.get(f"/v1/jobs/{job['id']}").json()
    assert stored["spec"]["model"]["source"] == f"file:{model}"
    assert stored["spec"]["dataset"]["source"] == f"file:{dataset}"
    assert (stored["tags"], stored["description"]) == (["own", "first-week"], "our own task, uploaded")

    plain = written(tmp_path / "plain.yaml", job_spec(name="plain"))
    job = sent(grpo, url, "submit", str(plain), "--set", "tags=[set-here]", "--set", "description=from --set",
               "--set", f"eval_dataset.source=file:{dataset}")
    stored = alpha.get(f"/v1/jobs/{job['id']}").json()
    assert (stored["tags"], stored["description"]) == (["set-here"], "from --set")
    assert stored["spec"]["eval_dataset"]["source"] == f"file:{dataset}"

    changes = written(tmp_path / "changes.yaml", {"tags": ["cloned"], "model": {"source": f"file:{model}"}})
    clone = sent(grpo, url, "clone", str(job["id"]), "--changes", str(changes),
                 "--set", "description=a clone")
    stored = alpha.get(f"/v1/jobs/{clone['id']}").json()
    assert (stored["tags"], stored["description"]) == (["cloned"], "a clone")
    assert stored["spec"]["model"]["source"] == f"file:{model}"


def test_what_only_this_machine_can_tell_stays_local(grpo, job_spec, tmp_path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"  # no API there: an answer could only come from here
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    code, _, err = grpo(nowhere, "submit", str(broken))
    assert code == 2 and "is not valid YAML/JSON" in err and "cannot reach" not in err
    code, _, err = grpo(nowhere, "submit", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err and "cannot reach" not in err
    listed = written(tmp_path / "list.yaml", [job_spec()])
    code, _, err = grpo(nowhere, "submit", str(listed), "--set", "name=x")
    assert code == 2 and "spec: must be a mapping of fields" in err
    # Checked against the service's JobSpec here, every bad field at once, before any API is called.
    bad = written(tmp_path / "bad.yaml", job_spec(grpo={"num_generations": 1}, bogus=1))
    code, _, err = grpo(nowhere, "submit", str(bad))
    assert code == 2 and "cannot reach" not in err, err
    assert [line.split()[1] for line in err.splitlines()] == ["grpo.num_generations:", "bogus:"], err


def test_every_invalid_field_is_printed_one_line_each(grpo, api_server, job_spec, tmp_path) -> None:
    url = api_server.http_url
    bad = {"grpo": {"num_generations": 1, "max_steps": 0}, "bogus": 1}
    spec = written(tmp_path / "bad.yaml", job_spec(name="bad", **bad))
    code, _, err = grpo(url, "submit", str(spec))
    lines = err.splitlines()
    assert code == 2 and all(line.startswith("error: ") for line in lines), err
    for field in ("grpo.num_generations", "grpo.max_steps", "bogus"):
        assert sum(f"{field}:" in line for line in lines) == 1, (field, err)
    assert "more)" not in err

    good = written(tmp_path / "good.yaml", job_spec(name="good"))
    job = sent(grpo, url, "submit", str(good))
    changes = written(tmp_path / "changes.yaml", bad)
    code, _, err = grpo(url, "clone", str(job["id"]), "--changes", str(changes))
    assert code == 2 and "more)" not in err
    for field in ("grpo.num_generations", "grpo.max_steps", "bogus"):
        assert sum(f"{field}:" in line for line in err.splitlines()) == 1, (field, err)
