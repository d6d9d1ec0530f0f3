"""The model a job leaves: at the end of a real task (supervisor and job process), a Hugging
Face folder beside the checkpoints (with report_to, TensorBoard files too) that
``from_pretrained`` loads with the policy's final weights, a generation config with the job's
sampling and a model card with its spec and last metrics; with LoRA and ``export.merge_lora``,
the merged weights (equal to base + adapter) and the adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensorboard_events import read_scalars
from transformers import AutoModelForCausalLM

from api.artifacts.paths import checkpoint_dir, model_dir, tensorboard_dir
from api.domain.lifecycle import Transition
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow
from api.store.telemetry import list_events, list_metrics


def run_to_the_end(database_url: str, job_id: int) -> None:
    from worker.tasks import run_job

    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
    assert run_job(job_id) == "succeeded"


def test_a_finished_job_leaves_a_model_folder_that_from_pretrained_loads(task_settings, submit, tiny_spec,
                                                                         database_url):
    job_id = submit(tiny_spec("exported", max_steps=3, checkpoint_every=2, grpo={"temperature": 0.7},
                              report_to=["tensorboard"]))
    run_to_the_end(database_url, job_id)

    folder = model_dir(task_settings, job_id)
    names = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names and "config.json" in names
    assert not {"optimizer.pt", "rng.pt", "trainer_state.json", "scheduler.pt"} & set(names)
    model = AutoModelForCausalLM.from_pretrained(folder)
    final = load_file(checkpoint_dir(task_settings, job_id) / "step-3" / "model.safetensors")
    for name, tensor in model.state_dict().items():
        if name in final:
            assert torch.equal(tensor, final[name]), name
    generation = json.loads((folder / "generation_config.json").read_text())
    sampling = generation["temperature"], generation["max_new_tokens"], generation["do_sample"]
    assert sampling == (0.7, 8, True)

    card = (folder / "README.md").read_text()
    with session_scope(database_url) as session:
        last = list_metrics(session, job_id)[-1]
        [event] = [e for e in list_events(session, job_id, limit=100) if e.type == "model"]
    assert card.startswith("---\nlibrary_name: transformers") and "# exported" in card
    assert f"| reward | {last.values['reward']:.6g} |" in card and "Metrics at step 3" in card
    assert "num_generations: 2" in card  # the spec (path: sources left out: tests/worker/test_model_card.py)
    assert event.data["step"] == 3 and event.data["bytes"] > 0

    # report_to: tensorboard charts the numbers the API serves, under the same names.
    with session_scope(database_url) as session:
        records = list_metrics(session, job_id)
    charted = read_scalars(tensorboard_dir(task_settings, job_id))
    for name in ("reward", "kl", "rewards/contains/mean", "loss"):
        assert charted[name] == pytest.approx({r.step: r.values[name] for r in records}), name


@pytest.mark.slow
def test_a_lora_job_with_merge_leaves_merged_weights_and_its_adapter(task_settings, submit, tiny_spec,
                                                                     database_url):
    pytest.importorskip("peft")
    from peft import PeftModel

    lora = {"source": "path:tiny", "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}}
    job_id = submit(tiny_spec("merged", max_steps=2, model=lora, export={"merge_lora": True},
                              grpo={"learning_rate": 0.05}))
    run_to_the_end(database_url, job_id)

    folder = model_dir(task_settings, job_id)
    adapter_config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == "path:tiny"  # the spec's, not a server folder
    merged = AutoModelForCausalLM.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(Path(task_settings.models_root) / "tiny")
    adapted = PeftModel.from_pretrained(base, folder / "adapter")
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        expected, got = adapted(ids).logits, merged(ids).logits
    assert torch.allclose(expected, got, atol=1e-5)  # tests/grpo_core/test_export.py: a non-zero adapter
    assert "library_name: transformers" in (folder / "README.md").read_text()


def test_a_job_starts_from_another_jobs_final_model_or_checkpoint(task_settings, submit, tiny_spec,
                                                                  database_url, run_in_process):
    first = submit(tiny_spec("first", max_steps=3, checkpoint_every=2, checkpoint_keep_last=2))
    run_to_the_end(database_url, first)
    # A learning rate too small to move fp32 weights: the second job's result is what it loaded.
    # The second jobs run the job process's body here (it resolves `job:` sources): a job process
    # each would add seconds of imports and nothing the first job's real task has not shown.
    for source, folder in ((f"job:{first}", model_dir(task_settings, first)),
                           (f"job:{first}@2", checkpoint_dir(task_settings, first) / "step-2")):
        second = submit(tiny_spec("second", max_steps=1, model={"source": source},
                                  grpo={"learning_rate": 1e-12}))
        ran = run_in_process(second)
        assert ran.status == "succeeded", ran.error
        loaded = load_file(folder / "model.safetensors")
        trained = load_file(model_dir(task_settings, second) / "model.safetensors")
        assert trained.keys() == loaded.keys()
        assert all(torch.allclose(trained[name], loaded[name], atol=1e-6) for name in loaded), source
        assert f"from `{source}`" in (model_dir(task_settings, second) / "README.md").read_text()


def test_a_job_source_never_loads_a_checkpoint_no_attempt_published(task_settings, submit, tiny_spec,
                                                                    database_url, run_in_process):
    """A complete folder without its row is a stale attempt's (docs/architecture.md §6)."""
    first = submit(tiny_spec("published", max_steps=2, checkpoint_every=2))
    run_to_the_end(database_url, first)
    root = checkpoint_dir(task_settings, first)
    shutil.copytree(root / "step-2", root / "step-7")
    second = run_in_process(submit(tiny_spec("from-stale", max_steps=1, model={"source": f"job:{first}@7"})))
    assert second.error is not None and second.error.code == "source_unavailable", second.error


def test_a_source_checkpoint_removed_since_submit_fails_source_unavailable(task_settings, submit, tiny_spec,
                                                                         database_url, job_of):
    from worker.tasks import run_job

    gone = submit(tiny_spec("later", max_steps=1, model={"source": "job:999999@5"}))
    with session_scope(database_url) as session:
        assert transition(session, gone, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
    assert run_job(gone) == "failed"
    job = job_of(gone)
    assert job.error.code == "source_unavailable" and "job:999999@5 no longer exists" in job.error.message
