"""Loading, normalizing and rendering prompt rows, and the seeded prompt sampler."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from grpo_core.agents.rendering import Conversations
from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.io import prompt_data
from grpo_core.io.prompt_data import PromptSampler, columns_of, load_rows
from grpo_core.spec.run_spec import DatasetSpec

ROWS = [{"question": "What is 2+2?", "answer": "4"}, {"question": "Name a colour.", "answer": "red"}]
EXPECTED = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "Name a colour.", "answer": "red"}]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` in the format named by the file's extension."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _file_spec(path: Path | str, **kwargs: Any) -> DatasetSpec:
    return DatasetSpec(**{"source": f"path:{path}", "prompt_field": "question", **kwargs})


def _error(spec: DatasetSpec, data_root: Path | None = None) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_rows(spec, data_root)
    return info.value


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_each_file_format(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"rows{suffix}", ROWS)
    assert load_rows(_file_spec(path)) == EXPECTED
    assert load_rows(_file_spec(path.name), data_root=tmp_path) == EXPECTED


def test_jsonl_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "a"}\n\n{"question": oops}\n', encoding="utf-8")
    err = _error(_file_spec(path))
    assert err.field == "dataset.source" and "line 3 is not valid JSON" in err.reason


def test_json_needs_a_top_level_list(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"data": ROWS}), encoding="utf-8")
    assert "list of objects" in _error(_file_spec(path)).reason


@pytest.mark.parametrize("name", ["missing.jsonl", "rows.txt", "rows"])
def test_missing_file_or_unsupported_type(tmp_path: Path, name: str) -> None:
    (tmp_path / "rows.txt").write_text("hello", encoding="utf-8")
    err = _error(_file_spec(tmp_path / name))
    assert err.field == "dataset.source"
    assert ("no such file" if name.endswith(".jsonl") else "unsupported file type") in err.reason


def test_prompt_field_wins_over_an_existing_prompt_column() -> None:
    rows = load_rows(DatasetSpec(prompts=[{"q": "use me", "prompt": "old", "x": 1}], prompt_field="q"))
    assert rows == [{"prompt": "use me", "x": 1}]
    assert columns_of(rows) == {"x"}


def test_missing_prompt_field_names_the_row_and_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", [*ROWS, {"a": 1, "b": 2}])
    err = _error(_file_spec(path))
    assert err.field == "dataset.prompt_field"
    assert err.reason == "row 2 has no 'question' column; columns: a, b"


def test_empty_dataset(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n", encoding="utf-8")
    err = _error(_file_spec(path))
    assert (err.field, err.reason) == ("dataset", "the dataset has no rows")
    # Inline rows are the spec's own: an empty list never gets this far (tests/grpo_core/test_spec_checks.py).
    with pytest.raises(ValidationError):
        DatasetSpec(prompts=[])


@pytest.mark.parametrize(
    "bad", [3, "", "   ", [], [{"role": "user"}], ["hi"], None, [{"role": "tool", "content": "x"}]]
)
def test_a_bad_prompt_in_a_file_names_the_row(tmp_path: Path, bad: Any) -> None:
    path = _write(tmp_path / "rows.jsonl", [{"question": "fine"}, {"question": bad}])
    err = _error(_file_spec(path))
    assert err.field == "dataset.source" and err.reason.startswith("row 1: 'question' must be")


def test_file_bad_prompt_names_the_row(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", [*ROWS, {"question": {"nested": 1}}])
    err = _error(_file_spec(path))
    assert err.field == "dataset.source" and err.reason.startswith("row 2: 'question' must be")


def test_chat_prompts_are_kept_and_rendered(word_tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    [row] = load_rows(DatasetSpec(prompts=[{"prompt": messages, "answer": "x"}]))
    assert row["prompt"] == messages
    word_tokenizer.chat_template = CHAT_TEMPLATE
    assert render_prompt(row["prompt"], word_tokenizer) == "<system>Be brief.\n<user>hi\n<assistant>"
    assert render_prompt("plain text", word_tokenizer) == "plain text"
    # chat_template_kwargs reach the template, as TRL passes them
    word_tokenizer.chat_template = "{{ greeting }}" + CHAT_TEMPLATE
    rendered = Conversations(word_tokenizer, None, {"greeting": "Hi! "}).prompt_text(row["prompt"])
    assert rendered == "Hi! <system>Be brief.\n<user>hi\n<assistant>"


def test_openai_training_rows_read_as_the_chat_templates_know_them(tmp_path: Path, word_tokenizer) -> None:
    """OpenAI's training files write a `developer` role and content as text parts: read as a
    `system` message and one string, so every later reader (templates, graders) sees one shape."""
    messages = [{"role": "developer", "content": [{"type": "text", "text": "Be "},
                                                  {"type": "input_text", "text": "brief."}]},
                {"role": "user", "content": "hi"}]
    path = _write(tmp_path / "rows.jsonl", [{"messages": messages, "reference_answer": "x"}])
    [row] = load_rows(_file_spec(path, prompt_field="messages"))
    assert row["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert row["reference_answer"] == "x"
    word_tokenizer.chat_template = CHAT_TEMPLATE
    assert render_prompt(row["prompt"], word_tokenizer) == "<system>Be brief.\n<user>hi\n<assistant>"
    for bad in ([{"role": "user", "content": []}], [{"role": "user", "content": [{"type": "image_url"}]}]):
        path = _write(tmp_path / "bad.jsonl", [{"messages": bad}])
        assert _error(_file_spec(path, prompt_field="messages")).reason.startswith("row 0: 'messages' must")


def render_prompt(prompt, tokenizer) -> str:
    return Conversations(tokenizer, None).prompt_text(prompt)


def test_chat_prompt_without_template(word_tokenizer) -> None:
    with pytest.raises(SpecError) as info:
        render_prompt([{"role": "user", "content": "hi"}], word_tokenizer)
    assert info.value.field == "dataset.prompts" and "chat template" in info.value.reason


def test_relative_escape_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _write(tmp_path / "secret.jsonl", ROWS)
    err = _error(_file_spec("../secret.jsonl"), data_root=root)
    assert err.field == "dataset.source" and "is outside" in err.reason
    _write(root / "inside.jsonl", ROWS)
    assert load_rows(_file_spec("sub/../inside.jsonl"), data_root=root) == EXPECTED


def test_absolute_path_outside_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = _write(tmp_path / "secret.jsonl", ROWS)
    assert "is outside" in _error(_file_spec(outside), data_root=root).reason
    # The local CLI passes no root and may read it.
    assert load_rows(_file_spec(outside)) == EXPECTED


def test_symlink_pointing_out_of_the_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = _write(tmp_path / "secret.jsonl", ROWS)
    (root / "link.jsonl").symlink_to(outside)
    (root / "linkdir").symlink_to(tmp_path)
    for name in ("link.jsonl", "linkdir/secret.jsonl"):
        assert "is outside" in _error(_file_spec(name), data_root=root).reason


def test_relative_path_without_root_uses_base_dir(tmp_path: Path) -> None:
    _write(tmp_path / "rows.csv", ROWS)
    assert load_rows(_file_spec("rows.csv"), base_dir=tmp_path) == EXPECTED


def test_row_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompt_data, "MAX_ROWS", 1)
    for suffix in (".jsonl", ".parquet"):
        err = _error(_file_spec(_write(tmp_path / f"rows{suffix}", ROWS)))
        assert err.field == "dataset.source" and "more than 1 rows" in err.reason
    assert _error(DatasetSpec(prompts=ROWS, prompt_field="question")).field == "dataset.prompts"


def test_an_unreachable_hub_is_source_unavailable_and_an_unknown_id_a_spec_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    datasets = pytest.importorskip("datasets")
    calls: list[tuple[Any, ...]] = []

    def offline(name: str, revision: str | None = None, split: str | None = None) -> None:
        calls.append((name, revision, split))
        raise ConnectionError("Couldn't reach the Hub (offline mode is enabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SourceUnavailable) as info:
        load_rows(DatasetSpec(source="hf:nobody/no-such-dataset@v1", split="test"))
    assert info.value.code == "source_unavailable"
    assert info.value.field == "dataset.source"
    assert "hub dataset 'nobody/no-such-dataset@v1': the source cannot be reached" in info.value.reason
    assert calls == [("nobody/no-such-dataset", "v1", "test")]

    def unknown(*args: Any, **kwargs: Any) -> None:
        raise FileNotFoundError("Dataset 'nobody/no-such-dataset' doesn't exist on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unknown)
    err = _error(DatasetSpec(source="hf:nobody/no-such-dataset"))
    assert err.field == "dataset.source" and err.reason.startswith("could not load hub dataset")


def test_a_hub_id_naming_a_local_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_dataset('outside/m')`` would read ./outside/m: the id is never looked up locally."""
    datasets = pytest.importorskip("datasets")
    (tmp_path / "outside" / "m").mkdir(parents=True)
    _write(tmp_path / "outside" / "m" / "train.jsonl", ROWS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the loader was called"))
    err = _error(DatasetSpec(source="hf:outside/m", prompt_field="question"))
    assert err.field == "dataset.source" and "a local path of that name exists" in err.reason


def test_hub_rows_are_normalized(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(ROWS))
    assert load_rows(DatasetSpec(source="hf:someone/maths", prompt_field="question")) == EXPECTED


def test_hub_without_the_datasets_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert "could not load hub dataset" in _error(DatasetSpec(source="hf:someone/maths")).reason


def _draw(sampler: PromptSampler, count: int) -> list[list[int]]:
    return [sampler.next_indices() for _ in range(count)]


def test_sampler_is_deterministic_and_covers_each_epoch() -> None:
    draws = _draw(PromptSampler(num_rows=10, batch_size=4, seed=7), 5)
    assert draws == _draw(PromptSampler(num_rows=10, batch_size=4, seed=7), 5)
    assert draws != _draw(PromptSampler(num_rows=10, batch_size=4, seed=8), 5)
    flat = [i for batch in draws for i in batch]
    assert sorted(flat[:10]) == sorted(flat[10:20]) == list(range(10))
    assert flat[:10] != flat[10:20]  # each epoch has its own permutation
    assert _draw(PromptSampler(5, 3, seed=0, shuffle=False), 2) == [[0, 1, 2], [3, 4, 0]]


def test_sampler_resume_draws_the_same_batches() -> None:
    first = PromptSampler(num_rows=10, batch_size=4, seed=3)
    draws = _draw(first, 7)
    replay = PromptSampler(num_rows=10, batch_size=4, seed=3)
    _draw(replay, 3)
    state = replay.state_dict()
    assert state == {"epoch": 1, "position": 2}
    resumed = PromptSampler(num_rows=10, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    assert _draw(resumed, 4) == draws[3:]


def test_sampler_draw_serials_count_every_index_drawn_and_survive_a_resume() -> None:
    sampler = PromptSampler(num_rows=10, batch_size=4, seed=3)
    serials = []
    for _ in range(4):  # the third batch straddles the first epoch boundary
        serials.append(sampler.draws_taken)
        sampler.next_indices()
    assert serials == [0, 4, 8, 12] and sampler.draws_taken == 16
    resumed = PromptSampler(num_rows=10, batch_size=4, seed=3)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.draws_taken == 16
    wide = PromptSampler(num_rows=3, batch_size=8, seed=1)
    wide.next_indices()
    assert wide.draws_taken == 8


def test_sampler_batch_larger_than_dataset() -> None:
    sampler = PromptSampler(num_rows=3, batch_size=8, seed=1)
    batch = sampler.next_indices()
    assert len(batch) == 8 and set(batch) == {0, 1, 2}
    assert sorted(batch[:3]) == sorted(batch[3:6]) == [0, 1, 2]
    assert sampler.state_dict() == {"epoch": 2, "position": 2}


def test_sampler_rejects_a_bad_state() -> None:
    sampler = PromptSampler(num_rows=3, batch_size=2, seed=0)
    for state in ({"epoch": 0, "position": 3}, {"epoch": -1, "position": 0}, {"position": 0}):
        with pytest.raises(ValueError):
            sampler.load_state_dict(state)


def test_a_checked_files_columns_are_every_rows_in_the_order_first_seen_within_bounds(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("question,answer\nhi,yes\n")
    found = prompt_data.check_rows_file(path, "csv", "question")
    assert found == prompt_data.FileRows(1, ("question", "answer"))
    rows = [{"prompt": "a", "b": 1}, {"prompt": "c", "a": 2}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert prompt_data.check_rows_file(path, "jsonl").columns == ("prompt", "b", "a")
    # Past the bounds they are left unknown (checked on the worker), never cut to a wrong list.
    wide = {"prompt": "a", **{f"c{n}": n for n in range(prompt_data.MAX_RECORDED_COLUMNS)}}
    long_name = {"prompt": "a", "x" * (prompt_data.MAX_COLUMN_NAME_CHARS + 1): 1}
    for row in (wide, long_name):
        path.write_text(json.dumps({"prompt": "first"}) + "\n" + json.dumps(row) + "\n")
        assert prompt_data.check_rows_file(path, "jsonl") == prompt_data.FileRows(2, None)
