"""Load prompt rows from a ``DatasetSpec``, render them, and draw seeded batches of row indices.

Every row comes out with its prompt under the key ``"prompt"`` (a non-empty string or a non-empty
list of ``{"role", "content"}`` messages); all other columns are kept so rewards can read them
(``answer``, ``solution``...). When ``prompt_field`` names another column and a ``"prompt"``
column also exists, the ``prompt_field`` column wins and the old ``"prompt"`` is dropped: the spec
said which column is the prompt, and keeping both would leave rewards guessing.

Rows are counted from 0 in messages, like the ``N`` in ``dataset.prompts.N``; ``.jsonl`` errors
name the 1-based line instead, since that is what an editor shows. Bad input raises
:class:`~grpo_core.errors.SpecError` so the CLI and the service can point at the field.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.install_hints import install_hint
from grpo_core.io.hub_loading import load_from_hub
from grpo_core.io.paths import resolve_under_root
from grpo_core.io.row_checks import (
    MAX_PARQUET_DECODED_BYTES,
    PARQUET_BATCH_ROWS,
    check_depth,
    check_text,
    decoded_bytes,
    decodes_to_more,
    parse_json,
)
from grpo_core.spec.prompt_rows import chat_prompt, prompt_problem
from grpo_core.spec.run_spec import DatasetSpec
from grpo_core.spec.sources import split_source

__all__ = ["MAX_ROWS", "FileRows", "PromptSampler", "check_rows_file", "columns_of", "load_rows"]

# Rows are held in memory for the whole run; past this a dataset belongs in a streaming loader.
MAX_ROWS = 1_000_000
SOURCE = "dataset.source"


def _resolve_file(location: str, data_root: Path | None, base_dir: Path | None) -> Path:
    """Resolve a ``path:`` location; with ``data_root`` it must stay inside after symlinks.

    The service passes its data folder so a spec cannot read arbitrary files on the worker. The
    containment check runs before the existence check so a spec cannot probe for outside files.
    """
    path = resolve_under_root(location, data_root, base_dir, field=SOURCE)
    if not path.is_file():
        # The service checked it at submit: missing now, it was moved or its disk is not mounted.
        raise SourceUnavailable(SOURCE, f"no such file: '{location}'")
    return path


def _iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"line {line_number}"
            row = parse_json(line, where, SOURCE)
            if not isinstance(row, dict):
                raise SpecError(SOURCE, f"{where} is not a JSON object")
            check_depth(row, where, SOURCE)
            yield row


def _iter_json(path: Path) -> Iterator[dict[str, Any]]:
    data = parse_json(path.read_text(encoding="utf-8"), "the file", SOURCE)
    if not isinstance(data, list):
        raise SpecError(SOURCE, "a .json file must hold a list of objects at the top level")
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            raise SpecError(SOURCE, f"row {index} is not a JSON object")
        check_depth(row, f"row {index}", SOURCE)
        yield row


def _iter_csv(path: Path) -> Iterator[dict[str, Any]]:
    # utf-8-sig: spreadsheet exports often start with a byte-order mark that would join a column name.
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for index, row in enumerate(csv.DictReader(handle)):
            if None in row:
                raise SpecError(SOURCE, f"row {index} has more fields than the header")
            yield row


def _iter_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise SpecError(SOURCE, f"reading .parquet files needs pyarrow "
                                f"({install_hint('data', 'pyarrow')})") from exc
    try:
        parquet = pq.ParquetFile(path)
        _check_count(parquet.metadata.num_rows, SOURCE)  # before loading it all into memory
        metadata = parquet.metadata
        # Plainly encoded data decodes to its uncompressed size, which the footer tells up front
        # (a compressed page of one long value would otherwise decode whole inside one batch).
        stored = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        decoded = 0
        if stored > MAX_PARQUET_DECODED_BYTES:
            raise SpecError(SOURCE, decodes_to_more())
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        while True:
            batch = next(batches, None)
            if batch is None:
                return
            # Measured before any Python object is made of the batch (at most PARQUET_BATCH_ROWS
            # rows), so the bound is checked as the file streams.
            decoded += sum(decoded_bytes(column) for column in batch.columns)
            if decoded > MAX_PARQUET_DECODED_BYTES:
                raise SpecError(SOURCE, decodes_to_more())
            yield from batch.to_pylist()
    except SpecError:
        raise
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise SpecError(SOURCE, f"could not read the parquet file: {exc}") from exc


_READERS = {".jsonl": _iter_jsonl, ".json": _iter_json, ".csv": _iter_csv, ".parquet": _iter_parquet}


def _check_count(count: int, field: str) -> None:
    if count > MAX_ROWS:
        raise SpecError(field, f"the dataset has more than {MAX_ROWS:,} rows")


def _read_file(location: str, data_root: Path | None, base_dir: Path | None) -> list[dict[str, Any]]:
    suffix = Path(location).suffix.lower()
    reader = _READERS.get(suffix)
    if reader is None:
        raise SpecError(
            SOURCE, f"unsupported file type '{suffix or location}'; use one of {', '.join(_READERS)}"
        )
    rows: list[dict[str, Any]] = []
    try:
        path = _resolve_file(location, data_root, base_dir)
        for row in reader(path):
            rows.append(row)
            _check_count(len(rows), SOURCE)
    except UnicodeDecodeError as exc:
        raise SpecError(SOURCE, f"'{location}' is not UTF-8 text") from exc
    except OSError as exc:
        raise SourceUnavailable(SOURCE, f"could not read '{location}': {exc.strerror or exc}") from exc
    except csv.Error as exc:
        raise SpecError(SOURCE, f"could not parse '{location}' as CSV: {exc}") from exc
    return rows


def _load_hub(location: str, split: str) -> list[dict[str, Any]]:
    """Load a hub dataset by id only (:mod:`grpo_core.io.hub_loading`): unreachable is SourceUnavailable, any
    other failure (unknown id, missing split, no ``datasets``) a SpecError."""

    def load(name: str, revision: str | None) -> list[dict[str, Any]]:
        import datasets

        dataset = datasets.load_dataset(name, revision=revision, split=split)
        _check_count(len(dataset), SOURCE)
        return [dict(row) for row in dataset]

    return load_from_hub(location, SOURCE, "hub dataset", load)


def _check_prompt(value: Any, field: str, prefix: str = "") -> Any:
    """A usable prompt (:func:`grpo_core.spec.prompt_rows.prompt_problem`), in the one shape the
    core reads (:func:`~grpo_core.spec.prompt_rows.chat_prompt`), or a SpecError at ``field``."""
    problem = prompt_problem(value)
    if problem is None:
        return chat_prompt(value)
    raise SpecError(field, f"{prefix}must be a non-empty string or a non-empty list of messages, "
                           f"got {problem}")


def _row_prompt(row: dict[str, Any], index: int, prompt_field: str, inline: bool) -> Any:
    """Row ``index``'s prompt, or a SpecError naming the row."""
    if prompt_field not in row:
        columns = ", ".join(str(key) for key in row) or "(none)"
        raise SpecError(
            "dataset.prompt_field", f"row {index} has no '{prompt_field}' column; columns: {columns}"
        )
    if inline:
        return _check_prompt(row[prompt_field], f"dataset.prompts.{index}.{prompt_field}")
    return _check_prompt(row[prompt_field], SOURCE, prefix=f"row {index}: '{prompt_field}' ")


def _normalize(raw: list[dict[str, Any]], prompt_field: str, inline: bool) -> list[dict[str, Any]]:
    if not raw:
        raise SpecError("dataset", "the dataset has no rows")
    rows = []
    for index, row in enumerate(raw):
        prompt = _row_prompt(row, index, prompt_field, inline)
        rest = {key: value for key, value in row.items() if key not in (prompt_field, "prompt")}
        rows.append({"prompt": prompt, **rest})
    return rows


# A file's columns are recorded for the submit checks up to these bounds; past them (a row of
# thousands of keys, a key of a kilobyte) they are left unknown and a job's rows are checked as it
# loads them, as before columns were recorded.
MAX_RECORDED_COLUMNS = 256
MAX_COLUMN_NAME_CHARS = 128


@dataclass(frozen=True)
class FileRows:
    """What :func:`check_rows_file` found: the row count and every column some row has, in the
    order first seen (None: more or longer names than are recorded)."""

    count: int
    columns: tuple[str, ...] | None


def check_rows_file(path: Path, file_format: str, prompt_field: str = "prompt") -> FileRows:
    """The rows and columns of the dataset file ``path`` (``file_format``: jsonl, json, csv or
    parquet), each row read and checked as :func:`load_rows` would, one at a time (a JSONL or CSV
    file is never held whole); a SpecError names the first bad row. For the service's uploads,
    checked before anything is stored, so it also refuses what a job could not carry: a string with
    a NUL or a lone surrogate (:func:`grpo_core.io.row_checks.text_problem`), naming its row and
    column."""
    reader = _READERS.get(f".{file_format}")
    if reader is None:
        raise SpecError(SOURCE, f"unsupported file type '{file_format}'; use one of {', '.join(_READERS)}")
    count = 0
    columns: dict[str, None] | None = {}  # a dict keeps the order first seen
    try:
        for count, row in enumerate(reader(path), start=1):
            _check_count(count, SOURCE)
            _row_prompt(row, count - 1, prompt_field, inline=False)
            check_text(row, count - 1, SOURCE)
            if columns is not None:
                names = [str(key) for key in row]
                columns.update(dict.fromkeys(names))
                if len(columns) > MAX_RECORDED_COLUMNS or max(map(len, names)) > MAX_COLUMN_NAME_CHARS:
                    columns = None
    except UnicodeDecodeError as exc:
        raise SpecError(SOURCE, "the file is not UTF-8 text") from exc
    except csv.Error as exc:
        raise SpecError(SOURCE, f"could not parse the file as CSV: {exc}") from exc
    if not count:
        raise SpecError("dataset", "the dataset has no rows")
    return FileRows(count, None if columns is None else tuple(columns))


def load_rows(
    spec: DatasetSpec, data_root: Path | None = None, *, base_dir: Path | None = None
) -> list[dict[str, Any]]:
    """Load and normalize the rows of ``spec``; ``data_root`` confines ``path:`` sources (service).

    With ``data_root=None`` (the local CLI) any absolute path is allowed, since the user can read
    those files anyway, and a relative one is taken from ``base_dir`` (the spec file's folder) or,
    without it, the working directory.
    """
    if spec.prompts is not None:
        _check_count(len(spec.prompts), "dataset.prompts")
        return _normalize([dict(row) for row in spec.prompts], spec.prompt_field, inline=True)
    assert spec.source is not None  # DatasetSpec guarantees exactly one origin
    scheme, location = split_source(spec.source)
    if scheme == "path":
        raw = _read_file(location, data_root, base_dir)
    else:
        raw = _load_hub(location, spec.split)
    return _normalize(raw, spec.prompt_field, inline=False)


def columns_of(rows: list[dict[str, Any]]) -> set[str]:
    """Columns other than the prompt, i.e. what rewards may ask for by name."""
    return {key for row in rows for key in row if key != "prompt"}


MAX_SAMPLE_VALUE_CHARS = 1000


def _cut(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return value if len(text) <= MAX_SAMPLE_VALUE_CHARS else text[:MAX_SAMPLE_VALUE_CHARS] + "…"


@dataclass(frozen=True)
class PromptSet:
    """The dataset's rows and, aligned with them, each row's prompt rendered once."""

    rows: list[dict[str, Any]]
    texts: list[str]

    def reward_columns(self, indices: list[int], repeat: int) -> dict[str, list[Any]]:
        """Every column but the prompt for the rows at ``indices``, each value ``repeat`` times
        (one per completion of the row's group); a row without the column gives None."""
        names = sorted({k for i in indices for k in self.rows[i] if k != "prompt"})
        return {name: [self.rows[i].get(name) for i in indices for _ in range(repeat)] for name in names}

    def sample_columns(self, indices: list[int], repeat: int) -> list[dict[str, Any]]:
        """Each row's columns but the prompt, ``repeat`` times, as a sample row shows them: a value
        longer than :data:`MAX_SAMPLE_VALUE_CHARS` (as text, or as JSON) is cut there, so a long
        reference cannot swell the samples kept every few steps."""
        shown = [{k: _cut(v) for k, v in self.rows[i].items() if k != "prompt"} for i in indices]
        return [row for row in shown for _ in range(repeat)]

    def prompt_messages(self, indices: list[int], repeat: int) -> list[list[dict[str, Any]] | None]:
        """Each row's prompt as messages (None for a string prompt), ``repeat`` times, for rewards
        that render the conversation their own way (``reward_model``'s chat template)."""
        prompts = [self.rows[i]["prompt"] for i in indices]
        return [p if isinstance(p, list) else None for p in prompts for _ in range(repeat)]


class PromptSampler:
    """Seeded batches of row indices, one shuffled pass over the rows per epoch.

    Epoch ``e`` uses the permutation from ``random.Random(seed + e)``, recomputed rather than
    stored, so a checkpoint only needs ``{"epoch", "position"}`` to resume the exact sequence.
    ``random`` rather than torch: its seeded shuffle has been stable across Python 3 releases, so
    a resume after an upgrade still draws the same rows. Batches may straddle epochs, and a batch
    larger than the dataset wraps as many times as needed.
    """

    def __init__(self, num_rows: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if num_rows < 1 or batch_size < 1:
            raise ValueError(f"num_rows and batch_size must be >= 1, got {num_rows} and {batch_size}")
        self.num_rows, self.batch_size, self.seed, self.shuffle = num_rows, batch_size, seed, shuffle
        self._epoch = self._position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_indices(self) -> list[int]:
        """The next ``batch_size`` row indices."""
        out: list[int] = []
        while len(out) < self.batch_size:
            take = min(self.batch_size - len(out), self.num_rows - self._position)
            out.extend(self._order[self._position : self._position + take])
            self._position += take
            if self._position == self.num_rows:
                self._epoch += 1
                self._position = 0
                self._order = self._permutation(self._epoch)
        return out

    @property
    def draws_taken(self) -> int:
        """How many indices were drawn so far: the serial number of the next one. Serials never
        repeat, unlike row indices (a batch can straddle epochs), so they key sampling randomness."""
        return self._epoch * self.num_rows + self._position

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved state; the sampler must have the same rows, seed and shuffle."""
        epoch, position = state.get("epoch"), state.get("position")
        if type(epoch) is not int or type(position) is not int or epoch < 0:
            raise ValueError(f"bad sampler state {state!r}")
        if not 0 <= position < self.num_rows:
            raise ValueError(f"sampler position {position} is out of range for {self.num_rows} rows")
        self._epoch, self._position = epoch, position
        self._order = self._permutation(epoch)
