"""``file:`` sources resolved as a job's process resolves them (worker.job_sources.loadable), from a
real local store and a real files row: the uploaded model's folder and datasets load through the
core under the roots returned, beside an operator's ``path:`` eval set; ten jobs naming one
model download it once on this host; a spec mixing an uploaded reward model with a ``path:`` one
is refused naming the field; a job's end releases what it held. And a reward's ``job:`` model
(another job's final model or published checkpoint, from a real jobs row) loads from that job's
folder under the artifacts root, however deep in the args the reward names it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_file_cache import CountingStore, model_archive, upload

from api.artifacts.paths import COMPLETE_MARK, checkpoint_dir, model_dir
from api.domain.job_spec import JobSpec
from api.settings import Settings
from api.store.db import session_scope
from api.store.files import add_file, new_file_id, set_status
from api.store.jobs import create_job
from api.store.telemetry import record_checkpoint
from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.io.model_loading import resolve_model_location, resolve_source_location
from grpo_core.io.prompt_data import load_rows
from worker import file_sources
from worker.file_cache import LINKS, USERS
from worker.file_sources import release_files
from worker.job_sources import loadable

ROWS = b'{"prompt": "2+3?", "answer": "5"}\n{"prompt": "hi"}\n'
EVAL_ROWS = b'[{"prompt": "1+1?", "answer": "2"}]'
MODEL = {"tiny/config.json": b"{}", "tiny/model.safetensors": b"w", "tiny/tokenizer.json": b"{}"}


@pytest.fixture
def store(tmp_path: Path, monkeypatch) -> CountingStore:
    counting = CountingStore(tmp_path / "bucket")
    monkeypatch.setattr(file_sources, "object_store", lambda settings: counting)
    return counting


@pytest.fixture
def host(tmp_path: Path, database_url: str) -> Settings:
    """One worker host's settings: its data root holds an operator's eval set."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shared-eval.json").write_bytes(EVAL_ROWS)
    return Settings(database_url=database_url, artifacts_root=tmp_path / "artifacts",
                    models_root=tmp_path / "models", data_root=tmp_path / "data",
                    worker_cache_dir=tmp_path / "cache")


@pytest.fixture
def uploaded(store: CountingStore, tmp_path: Path, database_url: str, team_id: int):
    """``uploaded(content, purpose, format) -> file id``: its object and its ready row."""
    def add(content: bytes, purpose: str, file_format: str) -> str:
        file_id = new_file_id()
        upload(store, tmp_path, file_id, content)
        with session_scope(database_url) as session:
            add_file(session, file_id, team_id, purpose, f"upload.{file_format}", file_format,
                     len(content), "-")
            set_status(session, file_id, "ready")
        return file_id

    return add


def spec_of(model: str, dataset: str, **fields) -> JobSpec:
    return JobSpec.model_validate({"name": "files", "model": {"source": model},
                                   "dataset": {"source": dataset},
                                   "rewards": [{"name": "contains", "args": {"text": "5"}}], **fields})


def test_uploaded_model_and_dataset_load_through_the_core_beside_an_operator_eval_set(
        store, host: Settings, uploaded) -> None:
    model_id = uploaded(model_archive(MODEL), "model", "tar")
    dataset_id = uploaded(ROWS, "dataset", "jsonl")
    spec = spec_of(f"file:{model_id}", f"file:{dataset_id}", eval_dataset={"source": "path:shared-eval.json"},
                   grpo={"eval_strategy": "steps", "eval_steps": 2})
    resolved, roots = loadable(spec, host)

    folder = Path(resolve_model_location(resolved.model, roots.models))
    assert folder.name == "tiny" and (folder / "config.json").read_bytes() == b"{}"  # its top folder
    assert folder.is_relative_to(Path(host.worker_cache_dir).resolve())
    assert [r["answer"] for r in load_rows(resolved.dataset, roots.data) if "answer" in r] == ["5"]
    assert load_rows(resolved.eval_dataset, roots.data)[0]["answer"] == "2"
    # A link, not a copy, of the cached upload: one copy per host whatever the jobs.
    linked = roots.data / resolved.dataset.source.removeprefix("path:")
    assert linked.suffix == ".jsonl" and linked.stat().st_nlink == 2

    release_files(host)
    assert not roots.data.exists()
    assert not list(Path(host.worker_cache_dir).glob(f"*/{USERS}/{os.getpid()}"))


def test_ten_jobs_naming_one_uploaded_model_download_it_once(store, host: Settings, uploaded) -> None:
    model_id = uploaded(model_archive(MODEL), "model", "tar")
    folders = {str(loadable(spec_of(f"file:{model_id}", "path:shared-eval.json"), host)[0].model.source)
               for _ in range(10)}
    assert store.downloads == 1 and len(folders) == 1


def test_a_job_without_uploads_keeps_the_service_roots_and_touches_no_cache(store, host: Settings) -> None:
    spec = spec_of("path:tiny", "path:shared-eval.json")
    resolved, roots = loadable(spec, host)
    assert resolved == spec and (roots.models, roots.data) == (host.models_root, host.data_root)
    assert store.downloads == 0 and not Path(host.worker_cache_dir).exists()


def test_uploaded_and_path_reward_models_together_are_refused_naming_the_field(
        store, host: Settings, uploaded) -> None:
    model_id = uploaded(model_archive(MODEL), "model", "tar")
    rewards = [{"name": "reward_model", "args": {"model": f"file:{model_id}"}},
               {"name": "reward_model", "args": {"model": "path:shared-rm"}}]
    with pytest.raises(SpecError) as raised:
        loadable(spec_of("path:tiny", "path:shared-eval.json", rewards=rewards), host)
    assert raised.value.field == "rewards.1.args.model"


def test_an_upload_missing_from_the_store_is_unavailable_not_the_teams_fault(
        store, host: Settings, uploaded) -> None:
    dataset_id = uploaded(ROWS, "dataset", "jsonl")
    store.delete(f"files/{dataset_id}")
    with pytest.raises(SourceUnavailable) as raised:
        loadable(spec_of("path:tiny", f"file:{dataset_id}"), host)
    assert raised.value.field == "dataset.source"
    assert not (Path(host.worker_cache_dir) / LINKS / str(os.getpid()) / "dataset.jsonl").exists()


def test_an_uploaded_judge_inside_a_multi_grader_loads_from_this_hosts_cache(
        store, host: Settings, uploaded) -> None:
    # The model is named deep in the args (graders.judge.model), not at a reward's args.model.
    model_id = uploaded(model_archive(MODEL), "model", "tar")
    judge = {"type": "label_model", "model": f"file:{model_id}", "labels": ["yes", "no"],
             "passing_labels": ["yes"], "input": [{"role": "user", "content": "{{sample.output_text}}?"}]}
    rewards = [{"name": "multi", "args": {"graders": {"judge": judge}, "calculate_output": "judge"}}]
    resolved, roots = loadable(spec_of("path:tiny", "path:shared-eval.json", rewards=rewards), host)
    named = resolved.rewards[0].args["graders"]["judge"]["model"]
    assert named.startswith("path:") and Path(named.removeprefix("path:")).name == "tiny"
    assert Path(named.removeprefix("path:")).is_relative_to(Path(host.worker_cache_dir).resolve())
    assert resolved.rewards[0].args["graders"]["judge"]["labels"] == ["yes", "no"]  # the rest kept
    assert roots.reward_models is not None


@pytest.fixture
def trained(host: Settings, database_url: str, team_id: int) -> int:
    """A job of the team with a final model and a published checkpoint of step 2: its id."""
    with session_scope(database_url) as session:
        job, _ = create_job(session, team_id, spec_of("path:tiny", "path:shared-eval.json"))
        step_2 = checkpoint_dir(host, job.id) / "step-2"
        record_checkpoint(session, job.id, 2, str(step_2), 1)
    for folder in (model_dir(host, job.id), step_2):
        folder.mkdir(parents=True)
        (folder / "config.json").write_bytes(b"{}")
    (step_2 / COMPLETE_MARK).write_text("{}")
    return job.id


def judged_by(model: str) -> dict:
    judge = {"type": "score_model", "model": model,
             "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
    return {"name": "multi", "args": {"graders": {"judge": judge}, "calculate_output": "judge"}}


def test_another_jobs_models_as_a_multis_judge_and_a_reward_model_load_from_its_folders(
        store, host: Settings, trained: int) -> None:
    rewards = [judged_by(f"job:{trained}"), {"name": "reward_model", "args": {"model": f"job:{trained}@2"}}]
    resolved, roots = loadable(spec_of("path:tiny", "path:shared-eval.json", rewards=rewards), host)
    assert roots.reward_models == host.artifacts_root and roots.models == host.models_root
    judge, reward_model = resolved.rewards[0].args["graders"]["judge"], resolved.rewards[1].args
    for field, named, folder in (
            ("rewards.0.args.graders.judge.model", judge["model"], model_dir(host, trained)),
            ("rewards.1.args.model", reward_model["model"], checkpoint_dir(host, trained) / "step-2")):
        # The core resolves it as it will load it: under the reward models' root.
        assert resolve_source_location(named, roots.reward_models, None, field) == str(folder.resolve())
    assert judge["input"] == rewards[0]["args"]["graders"]["judge"]["input"]  # the rest kept
    assert store.downloads == 0


def test_a_reward_models_job_source_gone_since_submit_is_unavailable_naming_the_field(
        store, host: Settings, trained: int) -> None:
    with pytest.raises(SourceUnavailable) as raised:
        loadable(spec_of("path:tiny", "path:shared-eval.json", rewards=[judged_by(f"job:{trained}@3")]), host)
    assert raised.value.field == "rewards.0.args.graders.judge.model"
    assert f"job:{trained}@3 no longer exists" in raised.value.reason


@pytest.mark.parametrize("other", ["path:shared-rm", "file"])
def test_a_job_reward_model_beside_one_from_another_place_is_refused_naming_the_field(
        store, host: Settings, uploaded, trained: int, other: str) -> None:
    if other == "file":
        other = f"file:{uploaded(model_archive(MODEL), 'model', 'tar')}"
    rewards = [judged_by(f"job:{trained}"), {"name": "reward_model", "args": {"model": other}}]
    with pytest.raises(SpecError) as raised:
        loadable(spec_of("path:tiny", "path:shared-eval.json", rewards=rewards), host)
    assert raised.value.field == "rewards.1.args.model" and "not both" in raised.value.reason
