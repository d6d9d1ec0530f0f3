"""``grpo_core.io.model_export``: the model folder made from a checkpoint, checked by loading it back:
only the model's files (no training state), the generation config with the job's sampling, a
model card with the spec (inline rows abbreviated) and the metrics, a LoRA adapter merged into
weights that compute what base + adapter compute, an adapter config naming the base by the spec's
source rather than a server folder, and on a real full disk (a small tmpfs) a ``disk_full`` error
with no half-written folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from full_disk import small_disk
from transformers import AutoModelForCausalLM

from api.domain.job_spec import JobSpec
from grpo_core.errors import GRPOError
from grpo_core.io.model_export import ADAPTER_DIR, export_model, generated_files, model_card, model_files
from grpo_core.spec.run_spec import RunSpec

ROWS = [{"prompt": f"question {n}"} for n in range(10)]


def spec(spec_type: type[RunSpec] = RunSpec, **fields) -> RunSpec:
    return spec_type.model_validate({
        "name": "card", "model": {"source": "path:tiny"}, "dataset": {"prompts": ROWS},
        "rewards": [{"name": "contains", "args": {"text": "yes"}}],
        "grpo": {"temperature": 0.5, "top_k": 20, "max_completion_length": 64}, **fields})


@pytest.fixture
def checkpoint(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A checkpoint as the trainer writes one: the model folder plus the training state."""
    folder = tmp_path / "checkpoints" / "step-7"
    shutil.copytree(tiny_model_dir, folder)
    for name in ("optimizer.pt", "scheduler.pt", "rng.pt", "experience-rank1.pt"):
        torch.save({}, folder / name)
    (folder / "trainer_state.json").write_text("{}")
    (folder / "distributed").mkdir()
    return folder


def test_the_model_is_the_checkpoints_model_files_with_a_card_and_sampling(checkpoint, tmp_path) -> None:
    assert {p.name for p in model_files(checkpoint)} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert not {p.name for p in model_files(checkpoint)} & {"optimizer.pt", "rng.pt", "trainer_state.json",
                                                            "experience-rank1.pt", "generation_config.json"}
    metrics = {"reward": 0.1234567, "kl": 2e-4, "note": "x"}
    out = export_model(checkpoint, tmp_path / "model", spec(), 7, metrics, job_id=12)
    generation = json.loads((out / "generation_config.json").read_text())
    base = json.loads((checkpoint / "generation_config.json").read_text())
    assert generation == {**base, "do_sample": True, "temperature": 0.5, "top_p": 1.0, "top_k": 20,
                          "max_new_tokens": 64}
    card = (out / "README.md").read_text()
    # A path: source is a name on the server's disk: a published card names no such thing.
    assert "GRPO service (job 12) for 7 steps from a model stored on the training service" in card
    assert "path:" not in card
    assert "| reward | 0.123457 |" in card and "| kl | 0.0002 |" in card and "note" not in card
    assert "question 2" in card and "question 3" not in card and "... 7 more rows" in card
    reference = AutoModelForCausalLM.from_pretrained(checkpoint)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    pairs = zip(reference.state_dict().values(), loaded.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert not list(tmp_path.glob(".model.tmp-*"))


def test_a_hub_base_is_named_in_the_card_and_generated_files_match_the_export(checkpoint, tmp_path) -> None:
    hub = spec(model={"source": "hf:owner/base-model@v2"})
    assert "base_model: owner/base-model\n" in model_card(hub, 3, None)
    out = export_model(checkpoint, tmp_path / "model", hub, 3, None)
    for name, data in generated_files(checkpoint, hub, 3, None).items():
        assert (out / name).read_bytes() == data  # what the API streams for a checkpoint is the same


def test_a_full_disk_fails_the_export_as_disk_full_keeping_the_previous_one_and_no_temporary_folder(
        checkpoint, tmp_path) -> None:
    with small_disk(tmp_path / "disk", 4 << 20) as disk:
        out = export_model(checkpoint, disk.path / "model", spec(), 7, None)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        disk.fill()
        with pytest.raises(GRPOError) as raised:
            export_model(checkpoint, out, spec(), 8, None)
        assert raised.value.code == "disk_full"
        assert f"the model folder {out} ({disk.free_bytes} bytes free)" in raised.value.message
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in disk.path.iterdir()) == [".filler", "model"]  # no temporary folder
        disk.free()  # the checkpoint is whole: once there is room, the same export succeeds
        export_model(checkpoint, out, spec(), 8, None)
        assert "for 8 steps" in (out / "README.md").read_text()


def saved_adapter(tiny_model_dir: Path, folder: Path):
    """A LoRA adapter with a random B (so it changes the output, as a trained one's would) saved
    as a checkpoint holds it: peft names the folder its base was loaded from in its config."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(base, config)
    adapted.save_pretrained(folder)
    shutil.copy(tiny_model_dir / "tokenizer.json", folder)
    shutil.copy(tiny_model_dir / "tokenizer_config.json", folder)
    return adapted


def test_an_adapter_names_its_base_by_the_spec_source_wherever_it_leaves_the_server(tiny_model_dir,
                                                                                    tmp_path) -> None:
    from peft import PeftModel

    checkpoint = tmp_path / "step-2"
    saved_adapter(tiny_model_dir, checkpoint)
    server_path = str(tiny_model_dir).encode()
    assert server_path in (checkpoint / "adapter_config.json").read_bytes()  # what peft writes
    for source in ("path:tiny", "hf:owner/base-model", "job:12"):
        for merge in (False, True):
            # job:ID is the service's (its job spec), exported after the worker loaded the folder it names.
            spec_type = JobSpec if source.startswith("job:") else RunSpec
            lora = spec(spec_type, model={"source": source, "lora": {"r": 4, "alpha": 8}},
                        export={"merge_lora": merge})
            # A checkpoint's download: its model files as they are, and the generated ones.
            generated = generated_files(checkpoint, lora, 2, None)
            assert "adapter_config.json" not in {p.name for p in model_files(checkpoint)}
            assert json.loads(generated["adapter_config.json"])["base_model_name_or_path"] == source
            out = export_model(checkpoint, tmp_path / f"model-{merge}", lora, 2, None,
                               base_location=str(tiny_model_dir))
            adapter = out / ADAPTER_DIR if merge else out
            config = json.loads((adapter / "adapter_config.json").read_text())
            assert config["base_model_name_or_path"] == source
            assert not [p for p in out.rglob("*") if p.is_file() and server_path in p.read_bytes()]
    # Whoever downloads it loads it onto their own copy of the base, which is all peft needs.
    mine = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / ADAPTER_DIR)
    original = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), checkpoint)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        assert torch.equal(mine(ids).logits, original(ids).logits)


def test_a_merged_lora_model_computes_what_base_plus_adapter_compute(tiny_model_dir, tmp_path) -> None:
    checkpoint = tmp_path / "step-2"
    adapted = saved_adapter(tiny_model_dir, checkpoint)
    lora = spec(model={"source": "path:tiny", "lora": {"r": 4, "alpha": 8}}, export={"merge_lora": True})

    out = export_model(checkpoint, tmp_path / "model", lora, 2, None, base_location=str(tiny_model_dir))
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        expected, got, before = adapted(ids).logits, merged(ids).logits, plain(ids).logits
    assert torch.allclose(expected, got, atol=1e-5) and not torch.allclose(before, got, atol=1e-3)


def test_merge_lora_needs_an_adapter() -> None:
    with pytest.raises(ValueError, match="merge_lora"):
        spec(export={"merge_lora": True})
