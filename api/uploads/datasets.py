"""A dataset upload: its format, told by its name's suffix (the one way the worker tells it too),
and its rows, checked by the core's own reader and prompt rules
(:func:`grpo_core.io.prompt_data.check_rows_file`), so an upload accepted here is one a job loads.
A bad one raises :class:`~api.domain.errors.InvalidInput` naming ``file`` (or ``prompt_field``)
and the first bad row. A good one's columns and prompt field are recorded with it, so a spec is
checked against them at submit (:mod:`api.http.submission`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path, PurePosixPath

from api.domain.errors import InvalidInput
from grpo_core.errors import SpecError
from grpo_core.io.prompt_data import FileRows, check_rows_file

DATASET_FORMATS = ("jsonl", "json", "csv", "parquet")
# A JSON array or a Parquet file is parsed whole to be checked (JSONL and CSV a row at a time):
# past this its rows would take the API gigabytes, so a larger one must come as JSONL.
MAX_WHOLE_FILE_BYTES = 64 * 1024 * 1024


def dataset_format(filename: str) -> str:
    """``jsonl``, ``json``, ``csv`` or ``parquet``, from ``filename``'s suffix."""
    suffix = PurePosixPath(filename).suffix.lower().removeprefix(".")
    if suffix not in DATASET_FORMATS:
        raise InvalidInput(f"a dataset is a .jsonl, .json (an array of rows), .csv or .parquet file, not "
                           f"'{filename}'", param="file")
    if suffix == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise InvalidInput("this service cannot read .parquet files (pyarrow is not installed); upload "
                           "the rows as .jsonl or .csv", param="file")
    return suffix


def check_dataset(path: Path, file_format: str, prompt_field: str) -> FileRows:
    """How many rows the file holds and its columns (recorded with it for the submit checks);
    InvalidInput naming the first bad row."""
    if file_format in ("json", "parquet") and path.stat().st_size > MAX_WHOLE_FILE_BYTES:
        raise InvalidInput(f"a .{file_format} dataset is read whole to be checked, so it may be at most "
                           f"{MAX_WHOLE_FILE_BYTES // 2**20} MiB; upload a larger one as .jsonl (one row "
                           "per line)", param="file")
    try:
        return check_rows_file(path, file_format, prompt_field)
    except SpecError as error:
        param = "prompt_field" if error.field == "dataset.prompt_field" else "file"
        raise InvalidInput(f"the dataset is not usable: {error.reason}", param=param) from None
