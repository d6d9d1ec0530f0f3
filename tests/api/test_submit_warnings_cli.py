"""``grpo submit`` and ``grpo clone`` tell the user what the service took from the spec but
ignores (a TRL field at its "off" value), on stderr, through ``api.cli.main.main`` against the
module's real server; ``--json`` prints the answer, which carries them."""

from __future__ import annotations

import json

import yaml

from api.cli.main import main


def grpo(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_and_clone_print_each_ignored_field_on_stderr(capsys, tmp_path, api_server, team_keys,
                                                              job_spec) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec(grpo={"push_to_hub": False, "use_vllm": False})))
    target = ["--api-url", api_server.http_url, "--api-key", team_keys.alpha]

    code, out, err = grpo(capsys, "submit", str(spec), *target)
    assert code == 0, err
    assert "submitted job" in out
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert [line.split(":")[1].strip() for line in warned] == ["grpo.push_to_hub", "grpo.use_vllm"]
    assert all("ignored" in line for line in warned)

    code, out, err = grpo(capsys, "submit", str(spec), "--json", *target)
    assert code == 0, err
    assert [w["param"] for w in json.loads(out)["warnings"]] == ["grpo.push_to_hub", "grpo.use_vllm"]
    assert "warning:" not in err  # --json: the answer holds them, stdout stays one JSON document

    job_id = json.loads(out)["id"]
    changes = tmp_path / "changes.yaml"
    changes.write_text(yaml.safe_dump({"grpo": {"log_completions": False}}))
    code, out, err = grpo(capsys, "clone", str(job_id), "--changes", str(changes), *target)
    assert code == 0, err
    assert [line.split(":")[1].strip() for line in err.splitlines() if line.startswith("warning: ")] == [
        "grpo.log_completions"]
