"""Small uploads that decode to a lot, built by streaming (never held whole), for the tests of
``POST /v1/files``'s bounds (tests/api/test_files_bombs.py) and benchmarks/upload_memory.py:
each is written to ``path`` and a few MB at most however much it unpacks to."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

_ZEROS = bytes(1024 * 1024)


def _write_zeros(handle, count: int) -> None:
    for start in range(0, count, len(_ZEROS)):
        handle.write(_ZEROS[:min(len(_ZEROS), count - start)])


def _header(name: str, type_: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = type_, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _model_members(tar: tarfile.TarFile) -> None:
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"x"), ("tokenizer.json", b"{}")):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def extended_header_bomb(path: Path, type_: bytes, size: int) -> Path:
    """A tar.gz whose first header is an extended one (``L``, ``K``, ``x`` or ``g``) announcing
    ``size`` bytes of zeros, then a valid small model."""
    with gzip.open(path, "wb", compresslevel=1) as handle:
        handle.write(_header("././@LongLink" if type_ in (b"L", b"K") else "pax", type_, size))
        _write_zeros(handle, size)
        handle.write(bytes(-size % 512))
        with tarfile.open(fileobj=handle, mode="w|") as tar:
            _model_members(tar)
    return path


def zeros_model(path: Path, size: int) -> Path:
    """A tar.gz of a model whose weights file is ``size`` zero bytes (gzip packs them ~1000:1)."""
    with gzip.open(path, "wb", compresslevel=1) as handle:
        with tarfile.open(fileobj=handle, mode="w|") as tar:
            _model_members(tar)
            info = tarfile.TarInfo("weights.safetensors")
            info.size = size
            tar.addfile(info, _Zeros(size))
    return path


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def parquet_dictionary_bomb(path: Path, rows: int = 50_000, value_bytes: int = 10_000) -> Path:
    """A Parquet file whose ``prompt`` column is one ``value_bytes`` string dictionary-encoded
    ``rows`` times: a few hundred bytes on disk, ``rows × value_bytes`` decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value_bytes]))
    pq.write_table(pa.table({"prompt": column}), path, compression="zstd")
    return path


def deep_json_row(depth: int) -> bytes:
    """A JSONL file whose second row nests a list ``depth`` deep."""
    return b'{"prompt": "fine"}\n{"prompt": "x", "deep": ' + b"[" * depth + b"]" * depth + b"}\n"


def long_integer_row(digits: int) -> bytes:
    """A JSONL file whose second row holds an integer of ``digits`` digits."""
    return b'{"prompt": "fine"}\n{"prompt": "x", "n": ' + b"7" * digits + b"}\n"


def normal_jsonl(size: int) -> bytes:
    """About ``size`` bytes of plain rows (the reference an upload of the same size is measured by)."""
    row = (json.dumps({"prompt": "What is 2+3? " * 4, "answer": "5"}) + "\n").encode()
    return row * max(1, size // len(row))
