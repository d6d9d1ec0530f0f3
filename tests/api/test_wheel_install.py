"""The project installed as the image installs it: a wheel built from exactly what the compose
file's Dockerfile copies, installed non-editable into a fresh virtualenv, run from a folder with
no source in it. Its migrations (data files, not a package) must still be found, a fresh SQLite
database migrated to the checkout's head, and ``grpo api`` must start and be ready.

Offline: the wheel is built with this interpreter's setuptools (no build isolation), and the
new virtualenv borrows this one's dependencies through a path file instead of installing them.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from compose_file import REPO, compose, copy_sources, inline_dockerfile, instructions
from packaging.requirements import Requirement
from waiting import wait_until

from api.cli.dev import free_port, stop_process
from api.store.migrate import head_revision

pytestmark = pytest.mark.slow


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the project installed from its wheel; its folder."""
    base = tmp_path_factory.mktemp("wheel-install")
    source = base / "source"
    source.mkdir()
    for name in copy_sources(instructions(inline_dockerfile(compose()["services"]))):
        origin = REPO / name.rstrip("/")
        if origin.is_dir():
            shutil.copytree(origin, source / origin.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / origin.name)
    build_system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    for requirement in map(Requirement, build_system["requires"]):
        found = metadata.version(requirement.name)  # no build isolation: this interpreter's must do
        assert requirement.specifier.contains(found), f"the build needs {requirement}; this venv has {found}"
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(base / "dist"), str(source)])
    wheel = next((base / "dist").glob("grpo_service-*.whl"))
    env = base / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(env)])
    python = env / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-index", str(wheel)])
    # Dependencies from this interpreter's site-packages. A bare path line: the .pth files in
    # there (this checkout's editable install among them) are not processed.
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=base).stdout.strip())
    (site / "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env


@pytest.fixture
def outside_env(tmp_path: Path) -> dict[str, str]:
    """An environment that cannot reach the checkout: no PYTHONPATH, no GRPO_* of the session."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GRPO_") and k != "PYTHONPATH"}


def installed(venv: Path, tmp_path: Path, env: dict[str, str], code: str) -> str:
    return run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env).stdout.strip()


def test_the_installed_package_is_imported_not_the_checkout(venv: Path, tmp_path: Path,
                                                             outside_env: dict[str, str]) -> None:
    found = installed(venv, tmp_path, outside_env, "import api, grpo_core, worker; "
                      "print(api.__file__, grpo_core.__file__, worker.__file__)")
    assert all(Path(path).is_relative_to(venv) for path in found.split()), found
    ini = Path(installed(venv, tmp_path, outside_env,
                         "from api.store.migrate import alembic_ini; print(alembic_ini())"))
    assert ini.is_relative_to(venv) and (ini.parent / "versions").is_dir(), ini


def test_the_installed_prestart_migrates_a_fresh_database(venv: Path, tmp_path: Path,
                                                          outside_env: dict[str, str]) -> None:
    database = tmp_path / "fresh.db"
    run([str(venv / "bin" / "python"), "-m", "api.store.migrate"], cwd=tmp_path,
        env={**outside_env, "GRPO_DATABASE_URL": f"sqlite:///{database}"})
    with sqlite3.connect(database) as connection:
        (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    assert revision == head_revision()


@pytest.fixture
def installed_api(venv: Path, tmp_path: Path, outside_env: dict[str, str]) -> Iterator[str]:
    """``grpo api`` of the installed package on a database never migrated; its URL."""
    port = free_port()
    env = {**outside_env, "GRPO_DATABASE_URL": f"sqlite:///{tmp_path / 'api.db'}",
           "GRPO_REDIS_URL": os.environ["GRPO_TEST_REDIS_URL"], "GRPO_ARTIFACTS_ROOT": str(tmp_path / "a")}
    log = tmp_path / "api.log"
    with log.open("w") as handle:
        process = subprocess.Popen([str(venv / "bin" / "grpo"), "api", "--port", str(port)], cwd=tmp_path,
                                   env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", process, log
    finally:
        stop_process(process)


def test_installed_grpo_api_migrates_and_becomes_ready(installed_api) -> None:
    url, process, log = installed_api

    def ready() -> httpx.Response | None:
        assert process.poll() is None, f"grpo api exited {process.returncode}:\n{log.read_text()}"
        try:
            response = httpx.get(f"{url}/readyz", timeout=2)
        except httpx.TransportError:
            return None
        return response if response.status_code == 200 else None

    response = wait_until(ready, 60, "the installed grpo api to be ready", interval=0.2,
                          details=log.read_text)
    assert response.json()["status"] in ("ready", "degraded"), response.text  # degraded: no scheduler
