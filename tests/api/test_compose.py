"""docker-compose.yml stays consistent with the code it runs.

Compose files break silently: a misspelt variable is ignored, a subcommand that does not exist
fails only on a deployed machine. These checks read the file and compare it with the settings
object, the ``grpo`` CLI and the prestart module, without needing Docker.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SERVICES = {"postgres", "redis", "api", "scheduler", "worker"}
APP_SERVICES = {"api", "scheduler", "worker"}  # ours, configured only through Settings
SERVING = {"postgres", "redis", "api", "scheduler", "worker"}  # every long-running service is probed
# Hugging Face's own variables, read by its libraries in the worker: the hub cache and token.
HUB_VARIABLES = {"HF_HOME", "HF_TOKEN"}
PROGRAMS = {"grpo", "python"}
# The `grpo` subcommands the stack runs; each must be registered in the grpo CLI's parser.
SERVICE_SUBCOMMANDS = {"api", "scheduler", "worker"}


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """Compose accepts a mapping or a list of ``KEY=VALUE``; both become a mapping."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: str(value) for key, value in env.items()}


def steps(service: dict[str, Any]) -> list[list[str]]:
    """The programs a service's command runs, in order; ``sh -c 'a && exec b'`` counts as a, b."""
    command = service.get("command") or []
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if words[:2] != ["sh", "-c"]:
        return [words]
    parts = [shlex.split(part) for part in re.split(r"&&|;", words[2])]
    return [part[1:] if part[:1] == ["exec"] else part for part in parts if part]


def all_steps(services: dict[str, dict[str, Any]]) -> list[list[str]]:
    return [step for name in sorted(APP_SERVICES) for step in steps(services[name])]


def registered_grpo_subcommands() -> set[str]:
    """Subcommands of the parser behind the ``grpo`` console script named in pyproject.toml."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    module_name, _, _ = pyproject["project"]["scripts"]["grpo"].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        pytest.fail(f"the grpo console script's module {module_name!r} does not import: {exc}")
    assert hasattr(module, "build_parser"), f"{module_name} has no build_parser() to inspect"
    parser: argparse.ArgumentParser = module.build_parser()
    return {
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }


def test_the_stack_has_its_five_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SERVICES
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")


def test_app_services_are_configured_only_through_settings(services: dict[str, dict[str, Any]]) -> None:
    prefix = Settings.model_config["env_prefix"]
    text = (REPO / "docker-compose.yml").read_text()
    used = {key for service in services.values() for key in environment(service) if key.startswith(prefix)}
    used |= set(re.findall(rf"\$\{{({prefix}\w+)", text))  # host variables interpolated into the file
    unknown = {name for name in used if name.removeprefix(prefix).lower() not in Settings.model_fields}
    assert not unknown, f"not fields of api.settings.Settings: {sorted(unknown)}"
    for name in APP_SERVICES:
        foreign = [key for key in environment(services[name]) if not key.startswith(prefix)
                   and key not in HUB_VARIABLES]
        assert not foreign, f"{name} sets variables the settings object never reads: {foreign}"


@pytest.mark.parametrize("name", sorted(SERVING))
def test_serving_services_have_a_healthcheck(services: dict[str, dict[str, Any]], name: str) -> None:
    check = services[name].get("healthcheck") or {}
    assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"


def test_api_healthcheck_probes_healthz(services: dict[str, dict[str, Any]]) -> None:
    assert "/healthz" in " ".join(services["api"]["healthcheck"]["test"])


def test_dependencies_wait_for_health(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends_on = service.get("depends_on") or {}
        # The short list form means service_started, which does not wait for readiness.
        assert isinstance(depends_on, dict), f"{name}: depends_on needs conditions"
        for dependency, spec in depends_on.items():
            assert spec.get("condition") == "service_healthy", f"{name} -> {dependency}"
    # A healthy api has run the prestart, so the schema is at head before these start.
    for name in ("scheduler", "worker"):
        assert "api" in services[name]["depends_on"], name


def test_the_worker_owns_all_of_its_hosts_gpus(services: dict[str, dict[str, Any]]) -> None:
    """One worker per host: it reserves every GPU (it packs jobs onto them itself); the CPU-slot
    count is a valid setting for the same worker on a host without CUDA."""
    worker = services["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    assert len(gpus) == 1 and gpus[0]["count"] == "all", devices
    slots = environment(worker).get("GRPO_WORKER_GPUS")
    assert Settings(worker_gpus=int(slots)).worker_gpus == int(slots) >= 1


def test_commands_run_only_our_programs(services: dict[str, dict[str, Any]]) -> None:
    for step in all_steps(services):
        assert step and step[0] in PROGRAMS, step


def test_api_migrates_before_serving(services: dict[str, dict[str, Any]]) -> None:
    api_steps = steps(services["api"])
    assert api_steps[0] == ["python", "-m", "api.store.migrate"]
    assert api_steps[-1][:2] == ["grpo", "api"]


def test_compose_runs_the_listed_subcommands(services: dict[str, dict[str, Any]]) -> None:
    used = {step[1] for step in all_steps(services) if step[0] == "grpo"}
    assert used == SERVICE_SUBCOMMANDS
    for name in ("scheduler", "worker"):  # their health checks are the CLI's own probe of them
        assert services[name]["healthcheck"]["test"] == ["CMD", "grpo", "health", name]


def test_hub_models_are_cached_in_a_volume(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    home = environment(worker)["HF_HOME"]
    assert any(volume.endswith(f":{home}") and volume.startswith("hf-cache:") for volume in worker["volumes"])


def test_grpo_subcommands_are_registered() -> None:
    missing = SERVICE_SUBCOMMANDS - registered_grpo_subcommands()
    assert not missing, f"docker-compose.yml runs grpo subcommands the CLI lacks: {sorted(missing)}"


def test_prestart_modules_import_without_torch(services: dict[str, dict[str, Any]]) -> None:
    """The prestart runs before every API start; importing torch would add seconds and memory."""
    modules = [step[2] for step in all_steps(services) if step[:2] == ["python", "-m"]]
    assert "api.store.migrate" in modules
    probe = "import importlib, sys; importlib.import_module(sys.argv[1]); sys.exit('torch' in sys.modules)"
    for module in modules:
        result = subprocess.run(
            [sys.executable, "-c", probe, module], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{module} is missing or imports torch:\n{result.stderr}"


def test_the_worker_gives_a_jobs_ranks_shared_memory(services):
    """A k-GPU job's rank processes exchange tensors through /dev/shm; Docker's 64 MB default
    is too small for that, so the worker must set its own size (in GB)."""
    size = str(services["worker"].get("shm_size", ""))
    match = re.fullmatch(r"(\d+)\s*g[b]?", size.lower())
    assert match and int(match.group(1)) >= 1, f"worker shm_size {size!r}: needs at least 1gb"
