"""What a dataset row may be, checked as each file is read (:mod:`grpo_core.io.prompt_data`), so
that a small file cannot decode to more than the reader can hold, nor carry what a job cannot:
JSON nested past :data:`MAX_JSON_DEPTH` or with an integer past Python's digit limit, a Parquet
file decoding to more than :data:`MAX_PARQUET_DECODED_BYTES`, text with a NUL or a lone
surrogate. Each refusal is a :class:`~grpo_core.errors.SpecError` at the ``field`` given, naming
the row (and column)."""

from __future__ import annotations

import json
from typing import Any

from grpo_core.errors import SpecError

# A row is a record, not a tree: past this depth JSON is refused by name (Python's parser would
# otherwise hit its recursion limit: a RecursionError, not an answer).
MAX_JSON_DEPTH = 64
# What a Parquet file's rows may decode to, counted batch by batch as Arrow decodes them: its
# dictionary encoding lets a few hundred bytes stand for gigabytes of text.
MAX_PARQUET_DECODED_BYTES = 256 * 2**20
PARQUET_BATCH_ROWS = 256


def parse_json(text: str, where: str, field: str) -> Any:
    """``text`` parsed, or a SpecError naming ``where``: for bad JSON, and for what Python's parser
    cannot hold (nesting past its recursion limit, an integer past its digit limit), which it
    raises as RecursionError and ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(field, f"{where} is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    except RecursionError:
        raise SpecError(field, f"{where} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # Python's int length limit (sys.get_int_max_str_digits)
        raise SpecError(field, f"{where} holds a number too long to read: {exc}") from None


def check_depth(value: Any, where: str, field: str) -> None:
    """SpecError when ``value`` nests deeper than MAX_JSON_DEPTH (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise SpecError(field, f"{where} is nested deeper than {MAX_JSON_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


def decoded_bytes(column: Any) -> int:
    """What ``column`` (an Arrow array) takes decoded. A dictionary-encoded one (as pyarrow reads
    back a column written as one) holds each distinct value once: it decodes to the length of the
    value each row points to, summed, which is what its Python objects will take."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        return column.get_total_buffer_size()
    values = column.dictionary
    try:
        lengths = pc.binary_length(values)
    except pa.ArrowNotImplementedError:  # fixed-width values (numbers, dates): each row one's width
        return column.indices.nbytes + len(column) * (values.nbytes // max(len(values), 1))
    return column.indices.nbytes + (pc.sum(pc.take(lengths, column.indices)).as_py() or 0)


def decodes_to_more() -> str:
    return f"the parquet file decodes to more than {MAX_PARQUET_DECODED_BYTES} bytes"


def text_problem(value: Any) -> str | None:
    """What makes a string in ``value`` (keys included, nested ones too) unusable as text: a NUL
    (SQL text and C strings end there) or a lone surrogate (not Unicode: it cannot be encoded as
    UTF-8 for a tokenizer, a log or a database). None when there is none."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "a NUL character"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"a lone surrogate (U+{ord(item[exc.start]):04X}), which is not Unicode text"
    return None


def check_text(row: dict[str, Any], index: int, field: str) -> None:
    """SpecError naming the row and column of the first string that is not text."""
    for column, value in row.items():
        problem = text_problem(column) or text_problem(value)
        if problem is not None:
            raise SpecError(field, f"row {index}: column '{_printable(column)}' holds {problem}")


def _printable(column: Any) -> str:
    return str(column).encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")[:64]
