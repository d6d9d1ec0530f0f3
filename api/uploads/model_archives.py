"""A model upload: a tar (or tar.gz) of a Hugging Face folder, stored as uploaded. Its members are
read as headers only (``config.json`` is parsed as JSON, nothing else is opened), so nothing in it
runs: no pickle, no code. The folder is the archive's root, or its one top-level folder
(``tar czf m.tgz my-model/`` makes one): :func:`model_folder_prefix` says which, for whoever
unpacks it.

Refused: members that could land outside the folder being unpacked (absolute names, ``..``),
links and devices; pickled weights (``*.bin``, ``*.pt``, …: loading them runs code) and Python
files (a model's own code, which the service never runs); an archive without ``config.json``,
``*.safetensors`` weights or tokenizer files. Every refusal raises
:class:`~api.domain.errors.InvalidInput` naming ``file`` and the member."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path, PurePosixPath

from api.domain.errors import InvalidInput

# Weights formats that unpickle (torch.load, pickle): loading them may run code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")
MAX_MEMBERS = 10_000  # a Hugging Face folder holds tens; far more is an archive bomb of headers
MAX_CONFIG_BYTES = 1024 * 1024


def _refuse(message: str) -> InvalidInput:
    return InvalidInput(f"the model archive is not usable: {message}", param="file")


def _member_name(member: tarfile.TarInfo) -> str:
    """The member's relative name, or a refusal of one that could escape or is no plain file."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or (parts and parts[0].endswith(":")) or "\\" in name:
        raise _refuse(f"'{name}' has an absolute name")
    if ".." in parts:
        raise _refuse(f"'{name}' has a '..' in its name")
    if member.issym() or member.islnk():
        raise _refuse(f"'{name}' is a link; a model folder holds only its own files")
    if not (member.isfile() or member.isdir()):
        raise _refuse(f"'{name}' is a device, pipe or other special file")
    return "/".join(part for part in parts if part != ".")


def model_folder_prefix(file_names: list[str]) -> str:
    """``""`` when the model's files are at the archive's root, else ``"TOP/"``: their one
    top-level folder."""
    tops = {name.split("/", 1)[0] for name in file_names}
    if len(tops) == 1 and all("/" in name for name in file_names):
        return f"{tops.pop()}/"
    return ""


def check_model_archive(path: Path, max_unpacked_bytes: int) -> list[str]:
    """The archive's file names (relative, in order), once every check passed. ``max_unpacked_bytes``
    bounds what the members add up to: a worker unpacks them all."""
    files: list[str] = []
    configs: dict[str, bytes] = {}  # each config.json at depth 1 or 2, read as it passes (one pass)
    unpacked = 0
    try:
        with tarfile.open(path, mode="r:*") as archive:
            for count, member in enumerate(archive, start=1):
                if count > MAX_MEMBERS:
                    raise _refuse(f"more than {MAX_MEMBERS} members")
                name = _member_name(member)
                if not member.isfile():
                    continue
                unpacked += member.size
                if unpacked > max_unpacked_bytes:
                    raise _refuse(f"its files add up to more than {max_unpacked_bytes} bytes")
                _check_suffix(name)
                files.append(name)
                if name.rsplit("/", 1)[-1] == "config.json" and name.count("/") <= 1:
                    configs[name] = _read_config(archive, member)
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:  # a truncated or foreign file
        raise _refuse(f"not a readable tar or tar.gz ({error})") from None
    prefix = model_folder_prefix(files)
    _check_folder({name.removeprefix(prefix) for name in files if name.startswith(prefix)})
    _check_config(configs[f"{prefix}config.json"])
    return files


def _check_suffix(name: str) -> None:
    lowered = name.lower()
    if lowered.endswith(PICKLE_SUFFIXES):
        raise _refuse(f"'{name}' holds pickled weights, whose loading runs code; save the model with "
                      "safetensors (save_pretrained(..., safe_serialization=True))")
    if lowered.endswith(".py"):
        raise _refuse(f"'{name}' is Python code; the service never runs a model's own code")


def _read_config(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    if member.size > MAX_CONFIG_BYTES:
        raise _refuse(f"{member.name} is larger than {MAX_CONFIG_BYTES} bytes")
    handle = archive.extractfile(member)
    return handle.read() if handle is not None else b""


def _check_config(raw: bytes) -> None:
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _refuse("config.json is not valid JSON") from None
    if not isinstance(config, dict):
        raise _refuse("config.json does not hold a JSON object")


def _check_folder(names: set[str]) -> None:
    if "config.json" not in names:
        raise _refuse("no config.json at the folder's top (the archive's root or its one top-level folder)")
    if not any(name.endswith(".safetensors") and "/" not in name for name in names):
        raise _refuse("no *.safetensors weights at the folder's top")
    if not names.intersection(TOKENIZER_FILES):
        raise _refuse(f"no tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
