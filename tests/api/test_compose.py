"""docker-compose.yml stays consistent with the code it runs.

Compose files break silently: a misspelt variable is ignored, a subcommand that does not exist
fails only on a deployed machine. These checks read the file and compare it with the settings
object, the ``grpo`` CLI and the prestart module, without needing Docker; the image's inline
Dockerfile is read instruction by instruction (``tests/compose_file.py``).
``tests/api/test_wheel_install.py`` installs what the image copies, non-editable, and runs it.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys
import tomllib
from typing import Any

import pytest
import yaml
from compose_file import (
    APP_SERVICES,
    COMPOSE_FILE,
    REPO,
    compose,
    copy_sources,
    inline_dockerfile,
    instructions,
)

from api.settings import Settings

SERVICES = {"postgres", "redis", "minio", "minio-bucket", "api", "scheduler", "worker"}
# every long-running service is probed
SERVING = {"postgres", "redis", "minio", "api", "scheduler", "worker"}
ONE_SHOT = {"minio-bucket"}  # runs to its end; the services after it wait for its success
# Hugging Face's own variables, read by its libraries in the worker: the hub cache and token.
HUB_VARIABLES = {"HF_HOME", "HF_TOKEN"}
# The standard variables the S3 client of GRPO_STORAGE_URL reads (api.storage.s3.s3_client).
STORAGE_VARIABLES = {"AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
BUCKET_URL = "s3://grpo/artifacts"
PROGRAMS = {"grpo", "python"}
# The `grpo` subcommands the stack runs; each must be registered in the grpo CLI's parser.
SERVICE_SUBCOMMANDS = {"api", "scheduler", "worker"}


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


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


def test_the_stack_has_its_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SERVICES
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")
    # MinIO tags only releases: one is named, so an upgrade is a change to this file.
    image = services["minio"]["image"]
    assert re.fullmatch(r"minio/minio:RELEASE\.[\dT:-]+Z", image), image


def test_app_services_are_configured_only_through_settings(services: dict[str, dict[str, Any]]) -> None:
    prefix = Settings.model_config["env_prefix"]
    text = (REPO / "docker-compose.yml").read_text()
    used = {key for service in services.values() for key in environment(service) if key.startswith(prefix)}
    used |= set(re.findall(rf"\$\{{({prefix}\w+)", text))  # host variables interpolated into the file
    unknown = {name for name in used if name.removeprefix(prefix).lower() not in Settings.model_fields}
    assert not unknown, f"not fields of api.settings.Settings: {sorted(unknown)}"
    for name in APP_SERVICES:
        foreign = [key for key in environment(services[name]) if not key.startswith(prefix)
                   and key not in HUB_VARIABLES | STORAGE_VARIABLES]
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
            wanted = "service_completed_successfully" if dependency in ONE_SHOT else "service_healthy"
            assert spec.get("condition") == wanted, f"{name} -> {dependency}"
    for name in ONE_SHOT:  # restarted, it would never have completed; probed, never healthy
        assert services[name].get("restart") == "no" and "healthcheck" not in services[name], name
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


def interpolated(value: str, host: dict[str, str]) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}`` read from ``host``."""
    def one(match: re.Match[str]) -> str:
        name, form, word = match.group(1), match.group(2), match.group(3)
        if host.get(name):
            return host[name]
        assert form != ":?", f"${{{name}}} is required: {word}"
        return word if form == ":-" else ""
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def test_artifacts_and_uploads_live_in_the_stacks_bucket(services: dict[str, dict[str, Any]]) -> None:
    """Every app service opens the one bucket the one-shot job makes, on the stack's MinIO, with
    MinIO's credentials; they start only once the bucket is made."""
    from api.storage.locations import open_store, parse_location
    from api.storage.s3 import S3Store

    host = {"POSTGRES_PASSWORD": "pg-secret", "MINIO_ROOT_PASSWORD": "minio-secret-1", "GRPO_API_TOKEN": "t"}
    minio = {key: interpolated(value, host) for key, value in environment(services["minio"]).items()}
    bucket_job = services["minio-bucket"]
    alias, _, bucket = bucket_job["command"][-1].partition("/")
    assert bucket_job["entrypoint"] == ["mc"] and bucket_job["command"][:2] == ["mb", "--ignore-existing"]
    assert bucket_job["image"] == services["minio"]["image"]  # mc comes with the server's image
    made_at = interpolated(environment(bucket_job)[f"MC_HOST_{alias}"], host)
    assert made_at == f"http://{minio['MINIO_ROOT_USER']}:{minio['MINIO_ROOT_PASSWORD']}@minio:9000"
    assert bucket_job["depends_on"] == {"minio": {"condition": "service_healthy"}}
    for name in APP_SERVICES:
        env = {key: interpolated(value, host) for key, value in environment(services[name]).items()}
        assert env["GRPO_STORAGE_URL"] == BUCKET_URL, name
        assert Settings(storage_url=env["GRPO_STORAGE_URL"]).storage_location == BUCKET_URL
        assert parse_location(BUCKET_URL).bucket == bucket, f"{name} opens a bucket the stack never makes"
        assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"], name
        assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"], name
        store = open_store(env["GRPO_STORAGE_URL"], env)  # as the service opens it: no request is made
        assert isinstance(store, S3Store) and (store.bucket, store.prefix) == ("grpo", "artifacts/")
        assert store.client.meta.endpoint_url == "http://minio:9000", name
        assert store.client.meta.region_name == env["AWS_REGION"], name
        assert services[name]["depends_on"]["minio-bucket"] == {"condition": "service_completed_successfully"}


def test_the_api_and_the_workers_share_no_artifacts_folder(services: dict[str, dict[str, Any]]) -> None:
    """With every artifact in the bucket, the artifacts root is a process's own working folder:
    the worker's is a volume no other service mounts, the api's is its container's."""
    def mounts(name: str) -> dict[str, str]:
        return {volume.split(":")[1]: volume.split(":")[0] for volume in services[name].get("volumes") or []}

    worker = environment(services["worker"])
    for root in (worker["GRPO_ARTIFACTS_ROOT"], worker["GRPO_WORKER_CACHE_DIR"]):
        volume = mounts("worker").get(root)
        assert volume, f"the worker keeps {root} in its container, lost on every restart"
        others = [name for name in services if name != "worker" and volume in mounts(name).values()]
        assert not others, f"{volume} ({root}) is shared with {others}"
    api_root = environment(services["api"])["GRPO_ARTIFACTS_ROOT"]
    assert api_root not in mounts("api"), "the api mounts its artifacts root: nothing needs it shared"


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


def test_the_worker_may_run_the_code_sandbox_only_where_the_operator_enables_it(services):
    """No service loosens Docker's confinement by default (the worker then advertises no
    ``code_sandbox``, and code_tests specs are refused at submit); the worker's comment carries
    the one line that enables it, and that line is valid Compose that turns off what blocks bwrap."""
    loosening = ("security_opt", "privileged", "cap_add")
    assert not [(name, key) for name, service in services.items() for key in loosening if key in service]
    text = COMPOSE_FILE.read_text()
    worker = text[text.index("\n  worker:\n"):text.index("\nvolumes:\n")]
    [line] = [line for line in worker.splitlines() if line.lstrip().startswith("# security_opt:")]
    enabled = yaml.safe_load(line.replace("# ", "", 1).strip())["security_opt"]
    assert {"seccomp=unconfined", "systempaths=unconfined", "apparmor=unconfined"} <= set(enabled), enabled


# ==== The image: one, built from this checkout by the inline Dockerfile ====

@pytest.fixture(scope="module")
def dockerfile(services: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    return instructions(inline_dockerfile(services))


def keywords(parsed: list[tuple[str, str]]) -> list[str]:
    return [keyword for keyword, _ in parsed]


def test_app_services_run_the_one_image_built_here(services: dict[str, dict[str, Any]]) -> None:
    builds = [services[name].get("build") or {} for name in APP_SERVICES]
    assert all(build == builds[0] for build in builds), "api, scheduler and worker must build one image"
    assert builds[0].get("context") == "." and builds[0].get("dockerfile_inline"), builds[0]
    images = {services[name].get("image") for name in APP_SERVICES}
    assert len(images) == 1 and None not in images, images
    for name in APP_SERVICES:
        # The image's entrypoint and user stand: an override brought back the start-time install.
        assert "entrypoint" not in services[name] and "user" not in services[name], name


def test_nothing_is_installed_at_container_start(services: dict[str, dict[str, Any]]) -> None:
    for name in APP_SERVICES:
        started = [services[name].get(key) for key in ("entrypoint", "command")]
        started.append((services[name].get("healthcheck") or {}).get("test"))
        installs = re.search(r"\bpip\b|\buv\b|ensurepip", repr(started))
        assert not installs, f"{name} installs at start: {started}"


def test_app_services_mount_named_volumes_only(services: dict[str, dict[str, Any]]) -> None:
    """No bind mount of the checkout (or anything else of the host): the image is the code."""
    declared = set(compose().get("volumes") or {})
    used: set[str] = set()
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = volume["source"] if isinstance(volume, dict) else volume.split(":", 1)[0]
            kind = volume.get("type", "volume") if isinstance(volume, dict) else "volume"
            assert kind == "volume" and source in declared, f"{name} mounts {volume!r}, not a named volume"
            used.add(source)
    assert used == declared, f"volumes nothing mounts: {sorted(declared - used)}"


def test_compose_interpolates_no_dollar_of_the_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    """Compose substitutes ``$VAR`` in dockerfile_inline from the host's environment (an unset one
    silently becomes empty); the Dockerfile's own variables must be written ``$$VAR``."""
    text = inline_dockerfile(services)
    assert "$" not in text.replace("$$", ""), "a single $ in dockerfile_inline: write $$ for Docker's"


def test_the_image_runs_as_a_fixed_non_root_user(dockerfile: list[tuple[str, str]]) -> None:
    users = [arguments for keyword, arguments in dockerfile if keyword == "USER"]
    assert users, "the image runs as root: no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: a fixed numeric uid, not root"
    last_user = max(i for i, keyword in enumerate(keywords(dockerfile)) if keyword == "USER")
    starts = [i for i, keyword in enumerate(keywords(dockerfile)) if keyword in ("CMD", "ENTRYPOINT")]
    assert starts and min(starts) > last_user, "USER must come before CMD / ENTRYPOINT"
    created = [arguments for keyword, arguments in dockerfile if keyword == "RUN" and "useradd" in arguments]
    assert created and re.search(rf"useradd\b.*--uid {uid}\b", created[0]), "USER is not useradd's uid"


def test_the_users_volumes_are_its_own(services: dict[str, dict[str, Any]],
                                       dockerfile: list[tuple[str, str]]) -> None:
    """An empty named volume takes its mount point's owner from the image: each app volume's
    mount point is made in the image and chowned to the user, else the user cannot write it."""
    chowns = [arguments for keyword, arguments in dockerfile if keyword == "RUN" and "chown" in arguments]
    assert chowns, "no mount point is given to the user"
    for name in APP_SERVICES:
        for volume in services[name].get("volumes") or []:
            target = volume.split(":")[1]
            made = [run for run in chowns if re.search(rf"mkdir -p [^&]*{re.escape(target)}\b", run)]
            owned = [run for run in made
                     if any(target.startswith(path) for path in re.findall(r"chown -R \S+ (\S+)", run))]
            assert owned, f"{name}: {target} is not made and chowned to the image's user"


def test_the_build_copies_only_what_the_install_needs(dockerfile: list[tuple[str, str]]) -> None:
    """COPY names each thing ``pip install`` needs (BuildKit then sends only those): never ``.``,
    so a .venv, artifacts or models in the checkout never reach the image (no .dockerignore)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = pyproject["tool"]["setuptools"]
    packages = {pattern.rstrip("*") for pattern in setuptools["packages"]["find"]["include"]}
    data = {path.split("/")[0] for paths in setuptools["data-files"].values() for path in paths}
    needed = {"pyproject.toml", pyproject["project"]["readme"]} | packages | data
    copied = [source.rstrip("/") for source in copy_sources(dockerfile)]
    assert sorted(copied) == sorted(needed), f"COPY {copied}; the install needs {sorted(needed)}"


def test_the_image_installs_the_code_sandbox(dockerfile: list[tuple[str, str]]) -> None:
    """bwrap from Debian's package (``grpo_core.rewards.sandbox``), and a Python under /usr for it to run
    programs with: the python image's own, in /usr/local."""
    installs = [shlex.split(arguments) for keyword, arguments in dockerfile
                if keyword == "RUN" and "apt-get install" in arguments]
    assert installs and "bubblewrap" in installs[0], installs
    base = next(arguments for keyword, arguments in dockerfile if keyword == "FROM")
    assert base.startswith("python:"), base


def test_dependencies_install_before_the_source_is_copied(dockerfile: list[tuple[str, str]]) -> None:
    """Layer caching: a code change must not reinstall torch. pyproject.toml is copied alone, the
    dependencies installed from it, then the rest copied."""
    copies = [i for i, (keyword, _) in enumerate(dockerfile) if keyword == "COPY"]
    assert dockerfile[copies[0]][1].split()[:-1] == ["pyproject.toml"], dockerfile[copies[0]]
    between = [arguments for keyword, arguments in dockerfile[copies[0]:copies[1]] if keyword == "RUN"]
    assert any("pip install -r" in run for run in between), "no dependency install before the source COPY"


def test_the_project_is_installed_non_editable_with_every_runtime_extra(
        dockerfile: list[tuple[str, str]]) -> None:
    """Every optional feature a spec may ask for is in the image, so the API accepts no spec the
    worker cannot run; the ``test`` extra stays out."""
    workdirs = [arguments for keyword, arguments in dockerfile[:-1] if keyword == "WORKDIR"]
    installs = [shlex.split(arguments) for keyword, arguments in dockerfile
                if keyword == "RUN" and re.search(r"pip install \S*\[", arguments)]
    assert len(installs) == 1, installs
    words = installs[0]
    target = next(word for word in words if "[" in word)
    assert "-e" not in words and "--editable" not in words, words
    assert target.startswith(f"{workdirs[0]}["), f"{target} is not the copied checkout ({workdirs[0]})"
    args = dict(arguments.split("=", 1) for keyword, arguments in dockerfile
                if keyword == "ARG" and "=" in arguments)
    extras = set(target[target.index("[") + 1:-1].replace("${EXTRAS}", args.get("EXTRAS", "")).split(","))
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras == set(optional) - {"test"}, extras


def test_torch_comes_from_the_index_the_operator_picks(services: dict[str, dict[str, Any]],
                                                         dockerfile: list[tuple[str, str]]) -> None:
    """GPU hosts need a CUDA build of torch and CPU hosts want the small CPU one: a build arg
    (set from the host's TORCH_INDEX_URL) chooses, and only torch comes from that index."""
    assert "TORCH_INDEX_URL" in services["api"]["build"]["args"]
    runs = [arguments for keyword, arguments in dockerfile if keyword == "RUN"]
    torch = [run for run in runs if '--index-url "${TORCH_INDEX_URL}"' in run]
    assert torch and re.search(r'--index-url "\$\{TORCH_INDEX_URL\}" "\$\(grep -E \'\^torch', torch[0]), torch
    assert any(keyword == "ARG" and arguments.startswith("TORCH_INDEX_URL=")
               for keyword, arguments in dockerfile), "TORCH_INDEX_URL needs a default"
