"""A model upload: a tar (or tar.gz) of a Hugging Face folder, stored as uploaded. Its members are
read as headers only (``config.json`` is parsed as JSON, nothing else is opened), so nothing in it
runs: no pickle, no code. The folder is the archive's root, or its one top-level folder
(``tar czf m.tgz my-model/`` makes one): :func:`model_folder_prefix` says which, for whoever
unpacks it.

Memory and time stay bounded whatever the archive says: an extended header (a GNU long name or
link, ``L``/``K``; a PAX record, ``x``/``g``) is refused by its declared size before it is read
(:class:`BoundedTarInfo`: Python's tarfile would read it whole into memory, so a 1 GiB long name
would take the API 1 GiB), and the members' sizes are added up from their headers and refused
once past the bound, before their data is decompressed (a gzip of zeros that unpacks to 4 GiB
costs a header, not 8 s of CPU). The worker unpacks through the same class.

Refused: members that could land outside the folder being unpacked (absolute names, ``..``),
links and devices; sparse members; pickled weights (``*.bin``, ``*.pt``, …: loading them runs code) and Python
files (a model's own code, which the service never runs); an archive without ``config.json``,
``*.safetensors`` weights or tokenizer files. Every refusal raises
:class:`~api.domain.errors.InvalidInput` naming ``file`` and the member."""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from api.domain.errors import InvalidInput, QuotaExceeded

# Weights formats that unpickle (torch.load, pickle): loading them may run code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")
MAX_MEMBERS = 10_000  # a Hugging Face folder holds tens; far more is an archive bomb of headers
MAX_CONFIG_BYTES = 1024 * 1024
# A long name or link is a name, not a buffer; a PAX record holds a few such fields. The chain of
# extended headers before one member (tarfile reads it by recursion) and their total are bounded
# too, so neither a chain nor many global (``g``) records add up to a buffer.
MAX_LONG_NAME_BYTES = 4096
MAX_PAX_RECORD_BYTES = 64 * 1024
MAX_EXTENDED_CHAIN = 8
MAX_EXTENDED_TOTAL_BYTES = 1024 * 1024
_LONG_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


def _refuse(message: str) -> InvalidInput:
    return InvalidInput(f"the model archive is not usable: {message}", param="file")


class UnsafeHeader(tarfile.HeaderError):
    """An extended header (or a sparse member) refused before it is read."""


class BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses an oversize extended header before tarfile reads its data.

    ``_proc_member`` is tarfile's documented hook for a subclass (``tarfile.open(...,
    tarinfo=BoundedTarInfo)``): it sees each header as parsed from its 512 bytes, before the blocks
    it announces are read. Sparse members are refused outright: an old GNU sparse header announces
    any number of extension blocks, a PAX 1.0 one a map of any length, and a model has no sparse
    files."""

    def _proc_member(self, tarfile_: tarfile.TarFile):  # type: ignore[override]
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeHeader(f"'{self.name}' is a sparse member")
        extended = self.type in _LONG_TYPES or self.type in _PAX_TYPES
        chain = getattr(tarfile_, "_bounded_chain", 0) + 1 if extended else 0
        tarfile_._bounded_chain = chain  # type: ignore[attr-defined]
        if not extended:
            return super()._proc_member(tarfile_)
        limit = MAX_LONG_NAME_BYTES if self.type in _LONG_TYPES else MAX_PAX_RECORD_BYTES
        kind = "long name or link" if self.type in _LONG_TYPES else "PAX"
        if self.size > limit:
            raise UnsafeHeader(f"a {kind} header of {self.size} bytes (at most {limit})")
        if chain > MAX_EXTENDED_CHAIN:
            raise UnsafeHeader(f"more than {MAX_EXTENDED_CHAIN} extended headers in a row")
        total = getattr(tarfile_, "_bounded_total", 0) + self.size
        if total > MAX_EXTENDED_TOTAL_BYTES:
            raise UnsafeHeader(f"extended headers adding up to more than {MAX_EXTENDED_TOTAL_BYTES} bytes")
        tarfile_._bounded_total = total  # type: ignore[attr-defined]
        return super()._proc_member(tarfile_)

    def _proc_gnusparse_10(self, next, pax_headers, tarfile_):  # noqa: A002 - tarfile's signature
        raise UnsafeHeader(f"'{next.name}' is a sparse member")


def open_bounded(path: Path) -> tarfile.TarFile:
    """The tar or tar.gz at ``path``, read through :class:`BoundedTarInfo`."""
    return tarfile.open(path, mode="r:*", tarinfo=BoundedTarInfo)


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


@dataclass(frozen=True)
class CheckedArchive:
    files: list[str]  # relative names, in order
    unpacked_bytes: int  # what its files add up to: what a worker's unpacked copy takes


def check_model_archive(path: Path, max_unpacked_bytes: int, quota_room: int | None = None) -> CheckedArchive:
    """The archive's files, once every check passed. ``max_unpacked_bytes`` bounds what the members
    add up to (a worker unpacks them all); ``quota_room`` (None: no quota), what the team's quota
    has left, checked on the way so that a bomb is stopped at its header either way."""
    files: list[str] = []
    configs: dict[str, bytes] = {}  # each config.json at depth 1 or 2, read as it passes (one pass)
    unpacked = 0
    try:
        with open_bounded(path) as archive:
            for count, member in enumerate(archive, start=1):
                if count > MAX_MEMBERS:
                    raise _refuse(f"more than {MAX_MEMBERS} members")
                name = _member_name(member)
                if not member.isfile():
                    continue
                unpacked += member.size  # checked before the member's data is decompressed
                if unpacked > max_unpacked_bytes:
                    raise _refuse(f"its files unpack to more than {max_unpacked_bytes} bytes "
                                  "(GRPO_UPLOAD_MAX_UNPACKED_BYTES)")
                if quota_room is not None and unpacked > quota_room:
                    raise QuotaExceeded(f"the model archive unpacks to more than the {max(quota_room, 0)} "
                                        "bytes left in the team's artifact quota (a model counts "
                                        "unpacked); nothing was stored", param="file")
                _check_suffix(name)
                files.append(name)
                if name.rsplit("/", 1)[-1] == "config.json" and name.count("/") <= 1:
                    configs[name] = _read_config(archive, member)
    except UnsafeHeader as error:
        raise _refuse(str(error)) from None
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:  # a truncated or foreign file
        raise _refuse(f"not a readable tar or tar.gz ({error})") from None
    prefix = model_folder_prefix(files)
    _check_folder({name.removeprefix(prefix) for name in files if name.startswith(prefix)})
    _check_config(configs[f"{prefix}config.json"])
    return CheckedArchive(files, unpacked)


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
