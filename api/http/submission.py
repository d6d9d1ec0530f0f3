"""What a JobSpec must satisfy before the service accepts it, beyond its own shape (which
pydantic checks while parsing the body: hub ids, inline rows, regexes that compile): ``path:``
sources stay inside the configured roots and exist, ``hf:`` sources only where the hub is allowed
(``eval_dataset``'s as ``dataset``'s), every reward is a known one with valid args and finds the
columns it reads in the inline rows or the uploaded file (the eval rows' too: the same rewards
score them; an uploaded dataset's columns and prompt field were recorded at upload), its time
budget is within the service's cap, and the pool exists with a worker big enough for the job. All
of it is checked before anything is written, so a rejected request leaves no row behind.
Where the model's config.json is readable (:mod:`api.http.model_config`), the longest sequence
the spec allows must fit the model's positions.
Torch-free, like everything the web process imports.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

from api.artifacts.paths import has_model_to_continue
from api.domain.errors import NotFound
from api.domain.job_spec import JobSpec, continued_job, split_any_source
from api.domain.spec_sources import file_sources, mixed_reward_models
from api.http.input_guard import text_fault
from api.http.model_config import model_config
from api.limits.pool_limits import effective_limits, limit_problems
from api.schemas.files import FileRead
from api.settings import Settings
from api.store.files import usable_file
from api.store.job_deletion import hold_against_deletion
from api.store.jobs import get_job
from api.store.pools import PoolSize, admission, list_pools, register_live_pool
from api.store.telemetry import published_artifacts
from api.store.verifiers import endpoints_for
from api.vocabulary import Heartbeat
from grpo_core.errors import SpecError, SpecWarning
from grpo_core.io.paths import resolve_under_root
from grpo_core.rewards import check_reward_rows, model_sources, required_capabilities, validate_reward_specs
from grpo_core.rewards.http_verifier import verifier_names
from grpo_core.rewards.sandbox import CAPABILITY as SANDBOX_CAPABILITY
from grpo_core.spec.prompt_rows import reward_column_names, reward_columns
from grpo_core.spec.run_spec import DatasetSpec, RewardSpec
from grpo_core.spec.size_checks import positions_problem, prompts_over_rows
from grpo_core.spec.spec_file import InvalidSpec

# NAME_MAX of every common filesystem: a longer component is refused before the OS is asked.
MAX_NAME_BYTES = 255


def check_submission(spec: JobSpec, settings: Settings) -> None:
    """Raise :class:`InvalidSpec` listing every problem found (a NUL anywhere, ``model.source``,
    ``dataset.source``, ``eval_dataset.source``, ``rewards.N.name``, ``rewards.N.args.FIELD``,
    reward models from more than one place: :func:`mixed_reward_models`)."""
    # A spec written in YAML is parsed past the input guard (api.http.input_guard), so its text
    # is checked here by the same rule: Postgres stores no NUL, UTF-8 no lone surrogate.
    fault = text_fault(spec.model_dump(mode="json"))
    problems: list[SpecError | None] = [SpecError(*fault)] if fault else []
    # A reward's model (wherever its args name one) is checked like model.source.
    reward_models = model_sources(spec.rewards)
    datasets = _datasets(spec)
    if not problems:  # a path with a NUL cannot even be looked at
        problems += [
            _check_path_source(spec.model.source, settings.models_root, "model.source"),
            *(_check_path_source(dataset.source, settings.data_root, f"{field}.source", "dataset.source")
              for field, dataset in datasets),
            *(_check_path_source(source, settings.models_root, field, "model.source")
              for field, source in reward_models),
        ]
    problems += [
        _check_hub_allowed(spec.model.source, settings, "model.source"),
        *(_check_hub_allowed(dataset.source, settings, f"{field}.source") for field, dataset in datasets),
        *(_check_hub_allowed(source, settings, field) for field, source in reward_models),
        _check_reward_budget(spec, settings),
        mixed_reward_models(spec),  # the core loads them under one root
    ]
    problems.append(_reward_rows_problem(spec.rewards, spec.dataset))
    if problems[-1] is None and spec.eval_dataset is not None:
        problems.append(_eval_rows_problem(spec.rewards, spec.eval_dataset, "eval_dataset.prompts"))
    errors = [problem for problem in problems if problem is not None]
    if errors:
        raise InvalidSpec(errors)


def _datasets(spec: JobSpec) -> list[tuple[str, DatasetSpec]]:
    """The spec's prompt sets by field: the training prompts and, when given, the eval prompts,
    which the worker loads from the same kinds of source and scores with the same rewards."""
    found = [("dataset", spec.dataset)]
    if spec.eval_dataset is not None:
        found.append(("eval_dataset", spec.eval_dataset))
    return found


def _reward_rows_problem(rewards: list[RewardSpec], dataset: DatasetSpec,
                         columns: set[str] | None = None) -> SpecError | None:
    """The rewards' args, and with inline rows the columns the rewards read and their values
    (with an uploaded file's ``columns``, those a reward may read: the columns the rewards read)."""
    inline = dataset.prompts
    try:
        if inline is not None:
            columns = reward_column_names(inline, dataset.prompt_field)
        validate_reward_specs(rewards, columns)
        if inline is not None:
            check_reward_rows(rewards, inline)
    except SpecError as exc:
        return exc
    return None


def _eval_rows_problem(rewards: list[RewardSpec], dataset: DatasetSpec, field: str,
                       columns: set[str] | None = None) -> SpecError | None:
    """:func:`_reward_rows_problem` for the eval rows, named at ``field`` (their rows or their
    file): they are scored by the same rewards, so a column they lack would fail the first eval
    point, and the rewards suit the training rows."""
    problem = _reward_rows_problem(rewards, dataset, columns)
    return None if problem is None else SpecError(field, f"{problem.field}: {problem.reason}")


def _check_hub_allowed(source: str | None, settings: Settings, field: str) -> SpecError | None:
    if source is None or settings.allow_hub or split_any_source(source)[0] != "hf":
        return None
    return SpecError(field, "this service does not load from the model hub (GRPO_ALLOW_HUB=false); "
                            "use a path: source")


def _check_reward_budget(spec: JobSpec, settings: Settings) -> SpecError | None:
    cap = settings.max_reward_timeout_seconds
    if spec.reward_timeout_seconds <= cap:
        return None
    return SpecError("reward_timeout_seconds", f"at most {cap:g} s on this service")


def _is_model_folder(path: Path) -> bool:
    # The worker loads Hugging Face folders; one without config.json would fail there instead.
    return path.is_dir() and (path / "config.json").is_file()


# field -> (the root's name in messages, what must be there, how to tell it is there)
_SOURCES: dict[str, tuple[str, str, Callable[[Path], bool]]] = {
    "model.source": ("models", "model folder (with a config.json)", _is_model_folder),
    "dataset.source": ("data", "file", Path.is_file),
}


def _check_path_source(source: str | None, root: Path, field: str,
                       kind: str | None = None) -> SpecError | None:
    """``None`` when ``source`` is absent, ``hf:``, or a ``path:`` that resolves (after ``..``
    and symlinks) to something inside ``root`` that exists. Messages never show the server's
    own paths. ``kind``: which of ``_SOURCES`` it is (default: ``field``)."""
    if source is None:
        return None
    root_name, what, exists = _SOURCES[kind or field]
    scheme, location = split_any_source(source)
    if scheme != "path":
        return None
    too_long = next((part for part in location.split("/") if len(part.encode()) > MAX_NAME_BYTES), None)
    if too_long is not None:
        return SpecError(field, f"a path component is longer than {MAX_NAME_BYTES} bytes")
    try:
        resolved = resolve_under_root(location, root, None, field)
        found = exists(resolved)
    except SpecError:
        return SpecError(field, f"'{location}' is outside the {root_name} root: name it relative to that "
                                "root, without '..' or links that lead out of it")
    except (OSError, RuntimeError):  # a symlink loop, or a name the filesystem refuses
        return SpecError(field, f"'{location}' cannot be resolved")
    if not found:
        return SpecError(field, f"no {what} '{location}' under the {root_name} root")
    return None


def check_placement(session: Session, spec: JobSpec, settings: Settings,
                    live_workers: Callable[[], list[Heartbeat]]) -> None:
    """Raise :class:`InvalidSpec` for a pool nobody registered (a typo would wait forever; a pool
    a live worker advertises but the scheduler has not recorded yet is recorded now), a
    job over one of the pool's limits (:mod:`api.limits.pool_limits`), or one asking for more GPUs
    than the pool's live workers have together (a job larger than the largest worker runs across
    several: a gang). A pool recorded before totals were (``total_gpus`` null) is bounded by its
    largest worker; a pool whose workers were never seen accepts any size."""
    found = admission(session, spec.resources.pool)
    if found is None and register_live_pool(session, spec.resources.pool, live_workers()):
        found = admission(session, spec.resources.pool)
    if found is None:
        known = ", ".join(sorted(p.name for p in list_pools(session))) or "none"
        raise InvalidSpec([SpecError("resources.pool", f"unknown pool '{spec.resources.pool}'; "
                                                       f"known pools: {known}")])
    size, overrides = found
    if problems := limit_problems(spec, effective_limits(overrides, settings)):
        raise InvalidSpec(problems)
    if problem := gpus_problem(spec, size):
        raise InvalidSpec([problem])


def gpus_problem(spec: JobSpec, size: PoolSize) -> SpecError | None:
    """``resources.gpus`` over the most the pool's workers offer together, naming both figures."""
    bound = size.total if size.total is not None else size.largest_worker
    if bound is None or spec.resources.gpus <= bound:
        return None
    pool = f"pool '{spec.resources.pool}'"
    if size.total is None:
        offered = f"the largest worker of {pool} has {size.largest_worker}"
    else:
        offered = (f"the live workers of {pool} have {size.total} together, its largest worker "
                   f"{size.largest_worker}; a job larger than the largest worker runs across several workers")
    return SpecError("resources.gpus", f"asks for {spec.resources.gpus} GPUs but {offered}")


def sandboxed_environment(spec: JobSpec) -> bool:
    """Whether the spec's environment runs in the sandbox (its source; a server runs elsewhere)."""
    return spec.environment is not None and spec.environment.source is not None


def check_capabilities(spec: JobSpec, live_workers: Callable[[], list[Heartbeat]]) -> None:
    """Raise :class:`InvalidSpec` when a reward needs what a worker must advertise (``code_tests``:
    a working sandbox) and no live worker of the job's pool advertises it: such a job could only
    fail. ``live_workers`` is called only when some reward needs a capability."""
    sandboxed = "tools" if spec.tools is not None else "environment" if sandboxed_environment(spec) else None
    if not required_capabilities(spec.rewards) and sandboxed is None:
        return
    pool, live = spec.resources.pool, live_workers()
    problems = capability_problems(spec.rewards, pool, live)
    if sandboxed is not None and SANDBOX_CAPABILITY not in offered_capabilities(pool, live):
        what = "tool calls" if sandboxed == "tools" else "an environment's episodes"
        problems.append(SpecError(sandboxed, (
            f"{what} run in the sandbox, and no live worker of pool '{pool}' advertises "
            f"'{SANDBOX_CAPABILITY}' (GET /v1/cluster lists each worker's capabilities)")))
    if problems:
        raise InvalidSpec(problems)


def offered_capabilities(pool: str, live: list[Heartbeat]) -> set[str]:
    """What the live workers of ``pool`` advertise, together."""
    return {capability for beat in live if beat.pool == pool for capability in beat.capabilities}


def capability_problems(rewards: list[RewardSpec], pool: str, live: list[Heartbeat]) -> list[SpecError]:
    """``rewards.N.name`` for each reward needing a capability no worker of ``pool`` among
    ``live`` advertises (a job's rewards at submit, a relayed dry run's)."""
    offered = offered_capabilities(pool, live)
    return [SpecError(f"rewards.{index}.name", (
        f"'{rewards[index].name}' needs a worker that advertises '{capability}', and no live worker "
        f"of pool '{pool}' does (a worker advertises it when its check at start passes; GET /v1/cluster "
        "lists each worker's capabilities)"))
        for index, capability in required_capabilities(rewards) if capability not in offered]


def check_job_sources(session: Session, spec: JobSpec, team_id: int, settings: Settings) -> None:
    """Every ``job:ID[@STEP]`` source of the spec, ``model.source`` and each model a reward names
    (a judge inside a ``multi`` too), passes :func:`job_source_problem`; else an
    :class:`InvalidSpec` naming each field that does not."""
    named = [("model.source", spec.model.source), *model_sources(spec.rewards)]
    problems = [problem for field, source in named
                if (problem := job_source_problem(session, field, source, team_id, settings)) is not None]
    if problems:
        raise InvalidSpec(problems)


def job_source_problem(session: Session, field: str, source: str, team_id: int,
                       settings: Settings) -> SpecError | None:
    """None when ``source`` (at ``field``) is no ``job:`` one, or names a job of the submitting
    team (admins included: the new job is the team's, and so is what it learns from or scores
    with) that has that model now: that job is then held against deletion until the caller's
    transaction ends, so a deletion sees the new job that loads its model."""
    named = continued_job(source)
    if named is None:
        return None
    job_id, step = named
    try:
        get_job(session, job_id, team_id)
    except NotFound:
        return SpecError(field, f"your team has no job {job_id}")
    if not hold_against_deletion(session, job_id):  # deleted since the read above
        return SpecError(field, f"job {job_id} was deleted")
    published = published_artifacts(session, job_id)
    if not has_model_to_continue(settings, job_id, step, published):  # a store away: 503, as any backend
        what = (f"keeps no checkpoint of step {step}" if step is not None
                else "has no final model or checkpoint yet")
        listing = f"GET /v1/jobs/{job_id}/checkpoints lists what it keeps"
        return SpecError(field, f"job {job_id} {what} ({listing})")
    return None


# A file: source's field -> the purpose its file must have been uploaded for.
def _purpose_for(field: str) -> str:
    return "dataset" if field.startswith(("dataset.", "eval_dataset.")) else "model"


def check_file_sources(session: Session, spec: JobSpec, team_id: int) -> dict[str, FileRead]:
    """Every ``file:ID`` source names a file of the submitting team (admins included: the job is
    the team's) that is ``ready`` and was uploaded for that use (a model archive for the model and
    a reward's model, a dataset for the prompts); the files by field. Read FOR SHARE: its deletion
    waits for this job."""
    problems = []
    files: dict[str, FileRead] = {}
    for field, file_id in file_sources(spec.model_dump(mode="json")):
        found = usable_file(session, file_id, team_id)
        wanted = _purpose_for(field)
        if found is None:
            problems.append(SpecError(field, f"your team has no file '{file_id}' (GET /v1/files lists them)"))
        elif found.status != "ready":
            problems.append(SpecError(field, f"file '{file_id}' is {found.status}, not ready"))
        elif found.purpose != wanted:
            problems.append(SpecError(field, f"file '{file_id}' was uploaded as a {found.purpose}; this "
                                             f"field takes a {wanted} (purpose={wanted})"))
        else:
            files[field] = found
    if problems:
        raise InvalidSpec(problems)
    return files


def dataset_file_warnings(spec: JobSpec, files: dict[str, FileRead]) -> list[SpecWarning]:
    """A round drawing more prompts than the uploaded training dataset's rows, told at submit as
    inline rows are (:meth:`RunSpec.warnings`); a file uploaded before its rows were counted is
    counted by the worker, which warns then."""
    found = files.get("dataset.source")
    if found is None or found.rows is None:
        return []
    over = prompts_over_rows(spec.grpo, found.rows, f"uploaded dataset {found.id}")
    return [] if over is None else [over]


def with_dataset_files(spec: JobSpec, files: dict[str, FileRead]) -> JobSpec:
    """``spec`` with each uploaded dataset (``files``: :func:`check_file_sources`'s) taking the
    prompt field its upload recorded where the spec sets none, so the stored spec says which
    column the worker reads; an :class:`InvalidSpec` when the file lacks that column
    (``dataset.prompt_field``) or one a reward reads (``rewards.N.args``; ``eval_dataset.source``
    for the eval file), naming the file's columns. Rewards' args were checked before
    (:func:`check_submission`). A file uploaded before columns were recorded is left to the worker."""
    problems: list[SpecError] = []
    for field, dataset in _datasets(spec):
        found = files.get(f"{field}.source")
        if found is None or found.prompt_field is None:
            continue
        if "prompt_field" not in dataset.model_fields_set:
            dataset = dataset.model_copy(update={"prompt_field": found.prompt_field})
            spec = spec.model_copy(update={field: dataset})
        problem = _file_columns_problem(spec.rewards, field, dataset, found)
        if problem is not None:
            problems.append(problem)
    if problems:
        raise InvalidSpec(problems)
    return spec


def _file_columns_problem(rewards: list[RewardSpec], field: str, dataset: DatasetSpec,
                          found: FileRead) -> SpecError | None:
    """What the file at ``field`` lacks of what the spec reads, by one rule with inline rows (None
    too when its columns were too many to record)."""
    if found.columns is None:
        return None
    if dataset.prompt_field not in found.columns:
        present = ", ".join(found.columns)
        return SpecError(f"{field}.prompt_field",
                         f"file '{found.id}' has no column '{dataset.prompt_field}'; its columns: {present}")
    columns = reward_columns(found.columns, dataset.prompt_field)
    problem = (_reward_rows_problem(rewards, dataset, columns) if field == "dataset"
               else _eval_rows_problem(rewards, dataset, f"{field}.source", columns))
    if problem is None:
        return None
    return SpecError(problem.field, f"{problem.reason} (file '{found.id}', {field}.source)")


def check_verifiers(session: Session, spec: JobSpec, team_id: int) -> None:
    """Every ``http_verifier`` reward names a verifier registered for the submitting team or the
    job's pool (its args are already valid: :func:`check_submission` ran first), and so does an
    environment's ``server``."""
    named = verifier_names(spec.rewards)
    server = spec.environment.server if spec.environment is not None else None
    usable = endpoints_for(session, {*named.values(), *([server] if server else [])}, team_id,
                           spec.resources.pool)
    missing = [SpecError(f"rewards.{index}.args.verifier",
                         f"no verifier '{name}' is registered for your team or pool '{spec.resources.pool}'")
               for index, name in named.items() if name not in usable]
    if server is not None and server not in usable:
        missing.append(SpecError("environment.server", f"no environment server '{server}' is registered for "
                                 f"your team or pool '{spec.resources.pool}' (an admin registers it with "
                                 "/v1/admin/verifiers)"))
    if missing:
        raise InvalidSpec(missing)


def check_model_positions(session: Session, spec: JobSpec, settings: Settings) -> None:
    """``grpo.max_completion_length`` when a prompt of ``max_prompt_length`` tokens and the longest
    completion are more than the model's positions, where its config.json can be read here (after
    the source checks: a ``job:`` or ``file:`` source is then the team's and usable)."""
    config = model_config(spec.model.source, settings, session)
    problem = None if config is None else positions_problem(
        spec.grpo.max_prompt_length, spec.grpo.max_completion_length, config)
    if problem is not None:
        raise InvalidSpec([problem])
