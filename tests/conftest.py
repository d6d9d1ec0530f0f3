"""Fixtures shared by every test package: tiny local models, built once per session, and the
JobSpec factory (``tests/specs.py``).

Nothing heavy is imported at module level: torch loads only when a test asks for a model, so
collecting the service's tests stays fast."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backing_services import provision
from specs import tiny_spec as _tiny_spec

# One OpenMP thread for torch in every test process and in all they start (ranks, `grpo train`),
# as the service processes of tests/service_stack.py already have: set here, before anything
# imports torch, and inherited by xdist's workers. Two workers fill the 2-core machine the suite
# is sized for; with a thread per core in each, their spinning threads fought over the same cores
# and in-process training ran several times slower (test_trainer.py beside two busy cores: 63 s,
# with one thread 24 s). An OMP_NUM_THREADS already set wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Postgres and Redis for the session (:mod:`backing_services`), started as this file is first
# imported: before any other conftest (tests/api's reads the Redis URL at import) and before
# xdist's workers start, which inherit the servers through the environment and start none.
_STOPS = provision()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _STOPS:
        _STOPS.pop()()


# The files that take longest, measured with --durations in a CI run (minutes each, mostly real
# jobs across processes), run first. xdist hands whole files (--dist loadfile) to whichever worker
# is free, in collection order: collected last (tests/worker sorts late), one of them was a tail
# the other worker watched idle for minutes. Any file not named keeps its place after them.
SLOWEST_FILES_FIRST = (
    "tests/chaos/test_stale_attempts.py",
    "tests/worker/test_gang_jobs.py",
    "tests/worker/test_multi_rank.py",
    "tests/grpo_core/test_multi_host_launch.py",
    "tests/e2e/test_dashboard.py",
    "tests/e2e/test_service.py",
    "tests/e2e/test_chat.py",
    "tests/worker/test_object_store_jobs.py",
    "tests/grpo_core/test_sharding.py",
    "tests/worker/test_team_scheduling.py",
    "tests/grpo_core/test_multi_host_checkpoints.py",
    "tests/grpo_core/test_cli.py",
    "tests/e2e/test_grpo_cli.py",
    "tests/worker/test_eval_runs.py",
    "tests/e2e/test_dashboard_charts.py",
    "tests/worker/test_run_job.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(SLOWEST_FILES_FIRST)}
    # A stable sort: the tests of a file keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init Llama-family model + tokenizer folder (no network)."""
    from grpo_core.io.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), family="llama")


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory):
    """``factory(family) -> folder``, cached per family."""
    from grpo_core.io.tiny_models import build_tiny_model

    built: dict[str, Path] = {}

    def factory(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), family=family)
        return built[family]

    return factory


@pytest.fixture(scope="session")
def tiny_spec():
    """``tiny_spec(name="tiny", *, max_steps=4, pool=None, **fields) -> dict``: a valid JobSpec
    body for the tiny model, a few seconds of CPU training (see ``tests/specs.py``)."""
    return _tiny_spec


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server as a process of its own on a free port, with an empty bucket, for the
    whole session (:mod:`storage_server`); give each test a prefix of its own."""
    from storage_server import s3_server as serving

    with serving() as server:
        yield server
