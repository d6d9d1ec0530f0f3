"""The import rules between packages (docs/architecture.md §7, and each package's docstring),
checked on the source: every ``import`` statement counts, also the lazy ones inside functions,
because a lazy import is still a dependency. And no two modules of ``api``, ``worker`` and
``grpo_core`` import each other, however indirectly (:mod:`import_graph`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_graph import cycles, import_graph

REPO = Path(__file__).resolve().parent.parent
SERVICE_FRAMEWORKS = ("fastapi", "starlette", "celery", "redis", "sqlalchemy", "alembic", "uvicorn")

# module prefix -> prefixes of this project's modules it must never import
SERVICE = ("api", "worker", *SERVICE_FRAMEWORKS)
# grpo_core's sub-packages in layers (each package docstring says the same): a layer imports only
# the layers before it, so the core reads bottom-up and no two of its parts call back into each other.
CORE_LAYERS = ("grpo_core.spec", "grpo_core.io", "grpo_core.parallel", "grpo_core.rewards",
               "grpo_core.agents", "grpo_core.algorithm", "grpo_core.run", "grpo_core.cli")
# rewards and agents' tools sit beside parallel, not above it: neither needs ranks or sharding.
_LAYER_ALSO_FORBIDS = {"grpo_core.rewards": ("grpo_core.parallel",),
                       "grpo_core.agents": ("grpo_core.parallel",)}


def _core_layer_rules() -> dict[str, tuple[str, ...]]:
    rules = {}
    for index, layer in enumerate(CORE_LAYERS):
        rules[layer] = (*SERVICE, *CORE_LAYERS[index + 1:], *_LAYER_ALSO_FORBIDS.get(layer, ()))
    # The foundations every layer may use import nothing of the core but errors.
    foundations = ("grpo_core.errors", "grpo_core.oom", "grpo_core.json_values", "grpo_core.install_hints")
    for foundation in foundations:
        rules[foundation] = (*SERVICE, *CORE_LAYERS)
    # The egress guard serves the web and scheduler processes too, which never load torch.
    rules["grpo_core.egress"] = (*SERVICE, *CORE_LAYERS, "torch", "transformers")
    return rules


FORBIDDEN: dict[str, tuple[str, ...]] = {
    "grpo_core": SERVICE,
    **_core_layer_rules(),
    # The run's contract is read by the web app, which must start without torch.
    "grpo_core.spec": (*SERVICE, *CORE_LAYERS[1:], "torch", "transformers"),
    # Read by the worker's supervisor, which never loads torch: the standard library only.
    "grpo_core.run.processes": (*SERVICE, *CORE_LAYERS, "torch", "transformers"),
    # Serving a loaded model, beside the run: the rollout's decoder and sampler (algorithm), the
    # spec's position rule; one process on one device, so no ranks, and no rewards or agents.
    "grpo_core.serving": (*SERVICE, "grpo_core.parallel", "grpo_core.rewards", "grpo_core.agents",
                          "grpo_core.run", "grpo_core.cli"),
    # A chat request is checked where it arrives, in processes that never load torch.
    "grpo_core.serving.requests": (*SERVICE, *CORE_LAYERS, "grpo_core.serving.engine", "torch",
                                   "transformers"),
    # The settings build the deployment's key names; they must not pull the store in.
    "api.settings": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                     *SERVICE_FRAMEWORKS),
    # Key names only, pure: a database URL is parsed (sqlalchemy's make_url) for the namespace.
    "api.redis_keys": ("api", "worker", "grpo_core", "fastapi", "starlette", "celery", "redis", "alembic",
                       "uvicorn"),
    "api.domain.lifecycle": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    # The service's own words: the core defines none of them, and they need nothing of it.
    "api.vocabulary": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    # The service's job spec: the core's run spec plus the service's words; the web app validates
    # with it, so like the core's spec it loads no torch.
    "api.domain.job_spec": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                     *CORE_LAYERS[1:], *SERVICE_FRAMEWORKS, "torch", "transformers"),
    # A spec's file and model sources: asks the rewards' registry (torch-free) which args name models.
    "api.domain.spec_sources": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli",
                                "worker", *SERVICE_FRAMEWORKS, "torch", "transformers"),
    # A job's tags and description: the spec, the PATCH body and the list's filter share them.
    "api.domain.job_labels": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    "api.domain.errors": ("api", "worker", "grpo_core"),
    # How a webhook is signed: the standard library only, so receivers can copy it.
    "api.security.webhook_signing": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    # Secrets sealed at rest: cryptography and the signing scheme's prefix, nothing of the service.
    "api.security.secret_box": (
        "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "api.settings", "worker",
        "grpo_core", *SERVICE_FRAMEWORKS),
    # Pure: where stored specs differ, for the compare route and its unit tests.
    "api.domain.spec_diff": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    # Words for people, read by the HTTP layer and by the CLI (which may run far from the service).
    "api.domain.explanations": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    "api.artifacts.paths": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                           "grpo_core", *SERVICE_FRAMEWORKS),
    # A team's artifact bytes on disk: the worker's quota check and the API's GET /v1/me count alike.
    "api.artifacts.usage": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                           *CORE_LAYERS[2:], *SERVICE_FRAMEWORKS),
    # What a backend outage raises: the two clients' exceptions, nothing of this project's.
    "api.outages": ("api", "worker", "grpo_core", "fastapi", "starlette", "celery"),
    # Checked at submit (api.http) and, for a run counted on the worker, by the worker.
    "api.limits.pool_limits": (
        "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
        *SERVICE_FRAMEWORKS),
    # Pure rules over a team's limits (the store, the HTTP layer and the CLI read them alike).
    "api.limits.team_limits": (
        "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
        *SERVICE_FRAMEWORKS),
    "api.limits.rate_limits": (
        "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
        *SERVICE_FRAMEWORKS),
    # The role packages' own __init__ modules hold docstrings only; each module has its rule above.
    "api.domain": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                   *SERVICE_FRAMEWORKS),
    "api.limits": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                   *SERVICE_FRAMEWORKS),
    "api.artifacts": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                      *SERVICE_FRAMEWORKS),
    "api.trials": ("api.http", "api.scheduling", "api.streaming", "api.cli", "worker", "fastapi",
                   "starlette"),
    "api.security": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                     *SERVICE_FRAMEWORKS),
    "api.schemas": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                    "sqlalchemy", "redis", "fastapi"),
    # A rewards dry run: the core's rewards and the store's verifiers, called by the HTTP layer.
    "api.trials.reward_trials": (
        "api.http", "api.scheduling", "api.streaming", "api.cli", "worker", "fastapi", "starlette",
        "torch", "transformers"),
    # The messages of a dry run the API relays to a worker: plain data both sides read.
    "api.trials.reward_trial_messages": (
        "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "api.trials.reward_trials",
        "worker", *SERVICE_FRAMEWORKS, "torch", "transformers"),
    # The store reads the cluster's state (api.domain.cluster_state) for the scheduler, never the scheduler.
    "api.store": ("api.http", "api.streaming", "api.cli", "worker", "fastapi", "starlette", "api.scheduling"),
    # Plain data the store builds and the policy decides on.
    "api.domain.cluster_state": ("api", "worker", "grpo_core", *SERVICE_FRAMEWORKS),
    "api.scheduling.policy": ("api.store", "api.http", "api.streaming", "api.cli", "api.scheduling.scheduler",
                              "worker", *SERVICE_FRAMEWORKS),
    "api.scheduling.plan_parts": ("api.store", "api.http", "api.streaming", "api.cli",
                                  "api.scheduling.scheduler", "worker", *SERVICE_FRAMEWORKS),
    "api.scheduling.preemption": ("api.store", "api.http", "api.streaming", "api.cli",
                                  "api.scheduling.scheduler", "worker", *SERVICE_FRAMEWORKS),
    "api.scheduling.gang_placement": ("api.store", "api.http", "api.streaming", "api.cli",
                                      "api.scheduling.scheduler", "worker", *SERVICE_FRAMEWORKS),
    "api.scheduling": ("api.http", "api.streaming", "api.cli", "worker", "fastapi"),
    # The webhook sender shares the scheduler's process, not its code: the store, settings, signing
    # and an HTTP client; no Redis, no Celery (a stack without a scheduler leader still notifies).
    "api.scheduling.webhook_sender": ("api.http", "api.streaming", "api.cli", "worker", "fastapi",
                                      "api.scheduling.scheduler", "api.scheduling.policy", "celery",
                                      "redis"),
    # So does the storage sweep: the store, settings and the object store; no Redis, no Celery.
    "api.scheduling.storage_sweeper": ("api.http", "api.streaming", "api.cli", "worker", "fastapi",
                                       "api.scheduling.scheduler", "api.scheduling.policy", "celery",
                                       "redis"),
    "api.streaming": ("api.http", "api.scheduling", "api.cli", "worker"),
    "api.http": ("api.cli", "worker", "celery"),
    "api.main": ("api.cli", "worker", "celery"),
    # The HTTP client side of the CLI works against a remote service: HTTP only.
    "api.cli.client": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    "api.cli.term_view": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    "api.cli.cluster_view": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                             "grpo_core"),
    "api.cli.printable": ("api", "worker", "grpo_core"),  # string handling only
    "api.cli.archives": ("api", "worker", "grpo_core"),
    "api.cli.field_setting": ("api", "worker", "grpo_core"),  # pure: --set text into plain data
    "api.cli.health": ("api.http", "api.streaming", "worker", "grpo_core"),
    "api.cli.monitor": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker"),
    # A client of POST /v1/rewards/run: it reads spec files (grpo_core.spec), never runs a reward.
    "api.cli.reward_commands": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                                "grpo_core.rewards", "torch", "transformers"),
    # A client of GET /v1/jobs/ID/samples: it prints what the API returns.
    "api.cli.samples_command": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                                "grpo_core", "torch", "transformers"),
    # A client of POST /v1/environments/run: the service checks and runs the environment.
    "api.cli.environment_commands": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                                     "grpo_core.agents", "grpo_core.rewards", "torch", "transformers"),
    # A client of POST /v1/chat/completions: it streams what the serving job writes, no database.
    "api.cli.chat_command": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                             "grpo_core"),
    # A client of GET /v1/usage: it prints what the API counted and touches no database.
    "api.cli.usage_command": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                              "grpo_core"),
    # A client of POST /v1/jobs?dry_run=true: it prints what the API estimated and touches no database.
    "api.cli.estimate_command": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                                 "grpo_core"),
    # A client of /v1/files: it packs a folder and streams HTTP, and touches no database.
    "api.cli.files_command": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                              "grpo_core"),
    # A client of GET /v1/jobs/compare: it prints what the API compared and touches no database.
    "api.cli.compare_command": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker",
                                "grpo_core"),
    # `grpo dev`'s account of the jobs reads the stack's own database, never the HTTP layer.
    "api.cli.dev_progress": ("api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    # Used by `grpo api`, `grpo scheduler` and `grpo admin`: the store's migrations, nothing else.
    "api.cli.schema_check": ("api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    "api.cli.calling": ("api.store", "api.http", "api.scheduling", "api.streaming", "worker", "grpo_core"),
    # Object storage, shared by the web process and the worker: no framework, no torch, nothing of
    # the service; it takes a URL, not the settings (they pull sqlalchemy in through redis_keys).
    "api.storage": ("api.settings", "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli",
                    "worker", "grpo_core", *SERVICE_FRAMEWORKS, "torch", "transformers"),
    # An upload's checks: plain functions of a local file (the core's row rules), no store, no HTTP.
    "api.uploads": ("api.settings", "api.store", "api.http", "api.scheduling", "api.streaming", "api.cli",
                    "worker", *CORE_LAYERS[2:], *SERVICE_FRAMEWORKS, "torch", "transformers"),
    # OpenAI's fine-tuning API mapped onto our jobs: pure functions of the schemas, the job spec
    # and the core's spec layer; the routes and the store call it, it calls neither.
    "api.openai_compat": ("api.store", "api.http", "api.scheduling", "api.streaming", "api.cli", "worker",
                          *CORE_LAYERS[1:], *SERVICE_FRAMEWORKS, "torch", "transformers"),
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


PROJECT_PACKAGES = ("api", "worker", "grpo_core")


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph(REPO, PROJECT_PACKAGES)
    # The graph holds lazy imports: the job's process imports its body inside main().
    assert "worker.attempt" in graph["worker.job_process"]
    found = cycles(graph)
    described = "\n".join("; ".join(f"{module} -> {sorted(graph[module] & set(cycle))}" for module in cycle)
                          for cycle in found)
    assert not found, f"import cycles (put what both sides need in a module of its own):\n{described}"


def test_the_cycle_finder_finds_cycles(tmp_path: Path) -> None:
    """A cycle through a lazy, a relative and a ``from pkg import module`` import; a module that
    only imports into the cycle is not part of it; a second cycle of two packages."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def later():\n    from . import c\n",
        "pkg/c.py": "import pkg.a.missing_name\n",
        "pkg/d.py": "from .a import something\n",
        "pkg/sub/__init__.py": "from ..e import thing\n",
        "pkg/e.py": "from pkg.sub import inner\n",
        "other/__init__.py": "import pkg.d\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert graph["pkg.d"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"} and graph["other"] == {"pkg.d"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.e", "pkg.sub"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


# What belongs to every role stays at api's top; everything else lives in the package of its role,
# so the top of the tree shows the service's parts (docs/architecture.md §7).
API_TOP = {"__init__", "main", "settings", "vocabulary", "redis_keys", "outages"}


def test_the_api_package_top_holds_only_what_every_role_shares() -> None:
    loose = {path.stem for path in (REPO / "api").glob("*.py")}
    assert loose <= API_TOP, f"loose at api's top: {sorted(loose - API_TOP)}; move each to its role's package"
