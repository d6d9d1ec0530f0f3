"""``grpo admin ...`` through ``api.cli.main.main`` against a migrated SQLite database: the same
store as ``/v1/admin``, reachable without a key (that is how the first admin key is made)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import service_db

from api.cli.main import main
from api.settings import get_settings
from api.store.api_keys import is_well_formed


class Grpo:
    """Runs ``grpo admin ARGS`` in-process: ``(exit code, stdout, stderr)``."""

    def __init__(self, capsys: pytest.CaptureFixture[str], database_url: str) -> None:
        self.capsys = capsys
        self.database_url = database_url

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        code = main(["admin", *argv])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str):
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def grpo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> Iterator[Grpo]:
    with service_db.migrated(service_db.sqlite_url(tmp_path)) as url:
        monkeypatch.setenv("GRPO_DATABASE_URL", url)
        get_settings.cache_clear()
        yield Grpo(capsys, url)
    get_settings.cache_clear()


def test_create_and_list_teams(grpo) -> None:
    code, out, err = grpo("create-team", "alpha", "--weight", "2")
    assert code == 0 and out.startswith("alpha\t") and "weight=2" in out and err == ""
    teams = {t["name"]: t for t in grpo.json("list-teams")}
    assert set(teams) == {"default", "alpha"}
    assert teams["alpha"]["weight"] == 2.0 and teams["alpha"]["quotas"] == {}
    assert grpo("set-weight", "alpha", "0.5")[0] == 0
    assert {t["name"]: t["weight"] for t in grpo.json("list-teams")}["alpha"] == 0.5


def test_create_key_prints_a_working_key_once(grpo, api_settings_factory, serve_api) -> None:
    assert grpo("create-team", "alpha")[0] == 0
    code, out, err = grpo("create-key", "alpha", "--admin", "--label", "bootstrap")
    key = out.strip()
    assert code == 0 and out == f"{key}\n" and is_well_formed(key)
    assert "shown only this once" in err and key not in err
    listed = grpo.json("list-keys", "--team", "alpha")
    assert [(k["prefix"], k["is_admin"], k["label"]) for k in listed] == [(key[:12], True, "bootstrap")]
    assert key not in json.dumps(listed)

    settings = api_settings_factory(grpo.database_url, api_token=None)
    with serve_api(settings) as server, httpx.Client(base_url=server.http_url, trust_env=False,
                                                     headers={"Authorization": f"Bearer {key}"}) as client:
        me = client.get("/v1/me").json()
        assert me["team"] == "alpha" and me["is_admin"] is True
        assert client.get("/v1/admin/teams").status_code == 200
        assert grpo("revoke-key", str(listed[0]["id"]))[0] == 0
        assert grpo.json("list-keys")[0]["revoked_at"] is not None


def test_set_quota_absolute_and_relative(grpo) -> None:
    grpo("create-team", "alpha")

    def quotas() -> dict[str, int]:
        return {t["name"]: t["quotas"] for t in grpo.json("list-teams")}["alpha"]

    assert grpo("set-quota", "alpha", "default", "4")[0] == 0 and quotas() == {"default": 4}
    assert grpo("set-quota", "alpha", "default", "+2")[0] == 0 and quotas() == {"default": 6}
    code, _, err = grpo("set-quota", "alpha", "default", "-7")
    assert code == 2 and "would make it -1" in err and quotas() == {"default": 6}
    assert grpo("set-quota", "alpha", "default", "-6")[0] == 0 and quotas() == {"default": 0}
    assert grpo("clear-quota", "alpha", "default")[0] == 0 and quotas() == {}
    assert grpo("set-quota", "alpha", "default", "-1")[0] == 2 and quotas() == {}
    assert grpo.json("set-quota", "alpha", "default", "+3")["quotas"] == {"default": 3}


def test_set_and_clear_the_artifact_quota(grpo) -> None:
    grpo("create-team", "alpha")

    def quota() -> int | None:
        return {t["name"]: t["artifact_quota_bytes"] for t in grpo.json("list-teams")}["alpha"]

    code, out, _ = grpo("set-artifact-quota", "alpha", "5000000000")
    assert code == 0 and "artifact_quota_bytes=5000000000" in out and quota() == 5_000_000_000
    code, _, err = grpo("set-artifact-quota", "alpha", "-1")
    assert code == 2 and "bytes: a byte quota must be" in err and quota() == 5_000_000_000
    assert grpo("set-artifact-quota", "nobody", "1")[0] == 2
    assert grpo("clear-artifact-quota", "alpha")[0] == 0 and quota() is None
    assert grpo("clear-artifact-quota", "alpha")[0] == 0  # idempotent


def test_pools(grpo) -> None:
    assert grpo.json("create-pool", "a100")["held"] is False
    assert grpo("hold", "a100")[1].startswith("a100\theld")
    assert {p["name"]: p["held"] for p in grpo.json("list-pools")} == {"a100": True, "default": False}
    assert grpo.json("resume", "a100")["held"] is False


def test_pool_limits_change_only_the_flags_given(grpo) -> None:
    grpo("create-pool", "a100")
    memory = str(8 * 2**30)

    def limits(*flags: str) -> tuple:
        got = grpo.json("set-pool-limits", "a100", *flags)["limits"]
        return got["max_steps"], got["job_memory_bytes"], got["max_tokens_per_step"]

    assert limits("--max-steps", "500", "--job-memory-bytes", memory) == (500, 8 * 2**30, None)
    assert limits("--max-steps", "default", "--max-tokens-per-step", "65536") == (None, 8 * 2**30, 65536)
    code, out, _ = grpo("list-pools")
    expected = f"limits: max_tokens_per_step=65536, job_memory_bytes={memory}"
    assert code == 0 and f"a100\topen\tmax_worker_gpus=-\ttotal_gpus=-\t{expected}" in out
    sandboxes = grpo.json("set-pool-limits", "a100", "--max-sandbox-memory-bytes", str(2**30))["limits"]
    assert (sandboxes["max_sandbox_memory_bytes"], sandboxes["max_tokens_per_step"]) == (2**30, 65536)


def test_team_limits_change_only_the_flags_given(grpo) -> None:
    grpo("create-team", "alpha")

    def limits(*flags: str) -> dict:
        return grpo.json("set-team-limits", "alpha", *flags)["limits"]

    assert limits("--max-priority", "high", "--reads-per-second", "2.5") == {
        "max_priority": "high", "max_queued_jobs": None, "reads_per_second": 2.5, "read_burst": None,
        "writes_per_second": None, "write_burst": None, "serve_idle_seconds": None, "gpu_hours_budget": None,
        "budget_period": None}
    changed = limits("--max-priority", "default", "--max-queued-jobs", "40", "--write-burst", "8")
    assert (changed["max_priority"], changed["max_queued_jobs"], changed["reads_per_second"],
            changed["write_burst"]) == (None, 40, 2.5, 8)
    code, out, _ = grpo("list-teams")
    expected = "limits: max_queued_jobs=40, reads_per_second=2.5, write_burst=8"
    assert code == 0 and expected in out
    budgeted = limits("--gpu-hours-budget", "120.5", "--budget-period", "week")
    assert (budgeted["gpu_hours_budget"], budgeted["budget_period"], budgeted["max_queued_jobs"]) == (
        120.5, "week", 40)
    code, _, err = grpo("set-team-limits", "alpha", "--budget-period", "year")
    assert code == 2 and "--budget-period" in err


@pytest.mark.parametrize("argv, message", [
    (("create-team", "alpha"), "already exists"),
    (("create-team", "Not-Lower"), "must match"),
    (("create-team", "gamma", "--weight", "0"), "weight must be"),
    (("create-key", "nobody"), "team 'nobody' not found"),
    (("set-quota", "alpha", "nowhere", "1"), "pool 'nowhere' not found"),
    (("set-weight", "alpha", "-1"), "weight must be"),
    (("revoke-key", "42"), "API key 42 not found"),
    (("create-pool", "default"), "already exists"),
    (("hold", "nowhere"), "pool 'nowhere' not found"),
    (("set-pool-limits", "default", "--max-steps", "0"), "--max-steps: Input should be greater than"),
    (("set-pool-limits", "nowhere", "--max-steps", "5"), "pool 'nowhere' not found"),
    (("list-keys", "--team", "nobody"), "team 'nobody' not found"),
    (("set-team-limits", "alpha", "--max-priority", "urgent"), "--max-priority: Input should be"),
    (("set-team-limits", "alpha", "--writes-per-second", "0"), "--writes-per-second: Input should be"),
    (("set-team-limits", "nobody", "--read-burst", "5"), "team 'nobody' not found"),
])
def test_bad_input_exits_2_and_changes_nothing(grpo, argv, message) -> None:
    grpo("create-team", "alpha")
    before = grpo.json("list-teams"), grpo.json("list-pools"), grpo.json("list-keys")
    code, out, err = grpo(*argv)
    assert code == 2 and out == "" and err.startswith("error: ") and message in err, err
    assert (grpo.json("list-teams"), grpo.json("list-pools"), grpo.json("list-keys")) == before


def test_unparsable_arguments_exit_2(grpo) -> None:
    for argv in (("set-quota", "alpha", "default", "many"), ("set-weight", "alpha", "heavy"),
                 ("frobnicate",)):
        with pytest.raises(SystemExit) as exited:
            grpo(*argv)
        assert exited.value.code == 2


def test_a_fresh_database_is_migrated_by_the_first_admin_command(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GRPO_DATABASE_URL", service_db.sqlite_url(tmp_path))
    get_settings.cache_clear()
    try:
        assert main(["admin", "create-team", "vision"]) == 0
        assert "vision" in capsys.readouterr().out
    finally:
        get_settings.cache_clear()


def test_an_unmigrated_database_is_refused_with_the_command_when_not_to_migrate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("GRPO_DATABASE_URL", service_db.sqlite_url(tmp_path))
    monkeypatch.setenv("GRPO_AUTO_MIGRATE", "false")
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as refused:
            main(["admin", "list-teams"])
    finally:
        get_settings.cache_clear()
    assert "was never migrated" in str(refused.value) and "python -m api.store.migrate" in str(refused.value)


# --- verifier services: the secret from an environment variable, never printed ---
VERIFIER_SECRET = "token-from-the-environment"


def test_register_list_and_delete_a_verifier_with_a_secret_from_the_env(grpo, monkeypatch) -> None:
    monkeypatch.setenv("GRADER_KEY", VERIFIER_SECRET)
    code, out, err = grpo("set-verifier", "grader", "--url", "http://127.0.0.1:9000/score",
                          "--pool", "default", "--auth-header", "Authorization",
                          "--auth-secret-env", "GRADER_KEY", "--max-batch-size", "16")
    assert code == 0, err
    assert out.startswith("grader\tpool=default\thttp://127.0.0.1:9000/score\tAuthorization: (secret set)")
    assert "batch=16" in out
    [listed] = grpo.json("list-verifiers")
    assert listed["auth_secret_set"] is True and listed["max_batch_size"] == 16 and listed["team"] is None
    code, out, err = grpo("list-verifiers")
    assert VERIFIER_SECRET not in out + err and out.startswith("grader\t")

    code, out, _ = grpo("delete-verifier", "grader")
    assert code == 0 and out.startswith("grader\t")
    assert grpo.json("list-verifiers") == []
    code, _, err = grpo("delete-verifier", "grader")
    assert code == 2 and "verifier 'grader' not found" in err


def test_bad_registrations_exit_2_naming_the_flag(grpo, monkeypatch) -> None:
    code, _, err = grpo("set-verifier", "grader", "--url", "http://u:p@host/score", "--pool", "default")
    assert code == 2 and "--url" in err and "credentials" in err
    code, _, err = grpo("set-verifier", "grader", "--url", "http://host/score")
    assert code == 2 and "exactly one of team and pool" in err
    code, _, err = grpo("set-verifier", "grader", "--url", "http://host/", "--team", "nobody")
    assert code == 2 and "team 'nobody' not found" in err
    monkeypatch.delenv("UNSET_SECRET", raising=False)
    code, _, err = grpo("set-verifier", "grader", "--url", "http://host/", "--pool", "default",
                        "--auth-header", "X-Key", "--auth-secret-env", "UNSET_SECRET")
    assert code == 2 and "$UNSET_SECRET is not set" in err
    assert grpo.json("list-verifiers") == []
