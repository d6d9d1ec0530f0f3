"""The import rules between packages (docs/architecture.md §7, and each package's docstring),
checked on the source: every ``import`` statement counts, also the lazy ones inside functions,
because a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVICE_FRAMEWORKS = ("fastapi", "starlette", "celery", "redis", "sqlalchemy", "alembic", "uvicorn")

# module prefix -> prefixes of this project's modules it must never import
SERVICE = ("api", "worker", *SERVICE_FRAMEWORKS)
# grpo_core's sub-packages in layers (each package docstring says the same): a layer imports only
# the layers before it, so the core reads bottom-up and no two of its parts call back into each other.
CORE_LAYERS = ("grpo_core.spec", "grpo_core.io", "grpo_core.parallel", "grpo_core.rewards",
               "grpo_core.algorithm", "grpo_core.run", "grpo_core.cli")
# rewards sit beside parallel, not above it: a reward never needs ranks or sharding.
_LAYER_ALSO_FORBIDS = {"grpo_core.rewards": ("grpo_core.parallel",)}


def _core_layer_rules() -> dict[str, tuple[str, ...]]:
    rules = {}
    for index, layer in enumerate(CORE_LAYERS):
        rules[layer] = (*SERVICE, *CORE_LAYERS[index + 1:], *_LAYER_ALSO_FORBIDS.get(layer, ()))
    # The foundations every layer may use import nothing of the core but errors.
    for foundation in ("grpo_core.errors", "grpo_core.oom", "grpo_core.json_values"):
        rules[foundation] = (*SERVICE, *CORE_LAYERS)
    return rules


FORBIDDEN: dict[str, tuple[str, ...]] = {
    "grpo_core": SERVICE,
    **_core_layer_rules(),
    # The run's contract is read by the web app, which must start without torch.
    "grpo_core.spec": (*SERVICE, *CORE_LAYERS[1:], "torch", "transformers"),
    # Read by the worker's supervisor, which never loads torch: the standard library only.
    "grpo_core.run.processes": (*SERVICE, *CORE_LAYERS, "torch", "transformers"),
    # The settings build the deployment's key names; they must not pull the store in.
    "api.settings": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                     *SERVICE_FRAMEWORKS),
    # Key names only, pure: a database URL is parsed (sqlalchemy's make_url) for the namespace.
    "api.redis_keys": ("api", "worker", "grpo_core", "fastapi", "starlette", "celery", "redis", "alembic",
                       "uvicorn"),
    "api.lifecycle": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    "api.vocabulary": ("api", "worker", *SERVICE_FRAMEWORKS),
    "api.domain_errors": ("api", "worker", "grpo_core"),
    # Words for people, read by the HTTP layer and by the CLI (which may run far from the service).
    "api.explanations": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    "api.artifact_paths": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                           "grpo_core", *SERVICE_FRAMEWORKS),
    # What a backend outage raises: the two clients' exceptions, nothing of this project's.
    "api.outages": ("api", "worker", "grpo_core", "fastapi", "starlette", "celery"),
    # Checked at submit (api.http) and, for a run counted on the worker, by the worker.
    "api.pool_limits": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                        *SERVICE_FRAMEWORKS),
    # Pure rules over a team's limits (the store, the HTTP layer and the CLI read them alike).
    "api.team_limits": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                        *SERVICE_FRAMEWORKS),
    "api.rate_limits": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                        *SERVICE_FRAMEWORKS),
    "api.schemas": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                    "sqlalchemy", "redis", "fastapi"),
    # The store reads the cluster's state (api.cluster_state) for the scheduler, never the scheduler.
    "api.store": ("api.http", "api.streaming", "api.cli", "worker", "fastapi", "starlette", "api.scheduling"),
    # Plain data the store builds and the policy decides on.
    "api.cluster_state": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    "api.scheduling.policy": ("api.store", "api.http", "api.streaming", "api.cli", "api.scheduling.scheduler",
                              "worker", *SERVICE_FRAMEWORKS),
    "api.scheduling": ("api.http", "api.streaming", "api.cli", "worker", "fastapi"),
    "api.streaming": ("api.http", "api.scheduling", "api.cli", "worker"),
    "api.http": ("api.cli", "worker", "celery"),
    "api.main": ("api.cli", "worker", "celery"),
    # The HTTP client side of the CLI works against a remote service: HTTP only.
    "api.cli.client": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    "api.cli.term_view": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    "api.cli.printable": ("api", "worker", "grpo_core"),  # string handling only
    "api.cli.archives": ("api", "worker", "grpo_core"),
    "api.cli.health": ("api.http", "api.streaming", "worker", "grpo_core"),
    "api.cli.monitor": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker"),
    # `grpo dev`'s account of the jobs reads the stack's own database, never the HTTP layer.
    "api.cli.dev_progress": ("api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    # Used by `grpo api`, `grpo scheduler` and `grpo admin`: the store's migrations, nothing else.
    "api.cli.schema_check": ("api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    "api.cli.calling": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    # The worker sees the service only through the store and the shared vocabulary.
    "worker": ("api.http", "api.scheduling", "api.streaming", "api.cli", "api.main", "fastapi"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rules_for(module: str) -> tuple[str, ...]:
    """The most specific rule's prefixes (a sub-module's rule refines its package's)."""
    matching = [prefix for prefix in FORBIDDEN if under(module, prefix)]
    return FORBIDDEN[max(matching, key=len)] if matching else ()


SOURCES = sorted(p for package in ("api", "worker", "grpo_core") for p in (REPO / package).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_package_rules(path: Path) -> None:
    module = module_name(path)
    forbidden = rules_for(module)
    bad = sorted(name for name in imported_modules(path) for prefix in forbidden
                 if under(name, prefix) and not under(name, module))
    assert not bad, f"{module} must not import {bad} (rules: {forbidden})"


def test_every_service_module_is_covered_by_a_rule() -> None:
    """A new top-level module or sub-package must say what it may import."""
    exempt = {"api", "api.cli", "api.cli.main", "api.cli.admin", "api.cli.dev"}
    uncovered = [module_name(p) for p in SOURCES
                 if not rules_for(module_name(p)) and module_name(p) not in exempt]
    assert not uncovered, f"no import rule for {uncovered}: add one to FORBIDDEN"


def test_a_rule_violation_is_detected(tmp_path: Path) -> None:
    """The scanner sees lazy imports inside functions and ``from X import Y`` forms."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from api.http import deps\n    import worker.tasks\n")
    names = imported_modules(source)
    assert {"api.http", "api.http.deps", "worker.tasks"} <= names
    assert any(under(n, "api.http") for n in names)
