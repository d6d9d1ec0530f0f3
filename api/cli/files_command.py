"""``grpo files upload PATH --purpose dataset|model``, ``grpo files list``, ``grpo files show ID``,
``grpo files rm ID``: a team's uploads (``/v1/files``), which its specs name as ``file:ID``. A
folder given to ``upload`` is packed to a tar.gz first (a temporary file, removed after), its
files at the archive's root, as a model upload wants. Exit codes and ``--json`` as the other
client commands (``api.cli.calling``)."""

from __future__ import annotations

import argparse
import os
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.cli.calling import BadArgument, Result, call_api

FILES_COMMAND = "files"


@contextmanager
def upload_source(path: Path) -> Iterator[tuple[Path, str]]:
    """``(file to send, its name)``: the file itself, or a folder packed to ``NAME.tar.gz``.
    Links in a folder are refused here, as the API would refuse them in the archive."""
    if not path.is_dir():
        if not path.is_file():
            raise BadArgument(f"{path}: no such file or folder")
        yield path, path.name
        return
    handle, packed = tempfile.mkstemp(prefix="grpo-upload-", suffix=".tar.gz")
    os.close(handle)
    try:
        with tarfile.open(packed, "w:gz") as archive:
            for member in sorted(path.rglob("*")):
                if member.is_symlink():
                    raise BadArgument(f"{member} is a link; pack the files it points to instead")
                if member.is_file():
                    archive.add(member, arcname=member.relative_to(path).as_posix(), recursive=False)
        yield Path(packed), f"{path.resolve().name}.tar.gz"
    finally:
        os.unlink(packed)


def file_lines(found: dict[str, Any]) -> list[str]:
    from api.cli.term_view import when

    # A dataset's recorded prompt field and columns: what its specs are checked against at submit.
    recorded = [f"prompt:    {found['prompt_field']}"] if found.get("prompt_field") else []
    if found.get("columns") is not None:
        recorded.append(f"columns:   {', '.join(found['columns'])}")
    return [f"id:        {found['id']}", f"purpose:   {found['purpose']}", f"filename:  {found['filename']}",
            f"format:    {found['format']}", f"bytes:     {found['bytes']}", *recorded,
            f"sha256:    {found['sha256']}", f"status:    {found['status']}",
            f"created:   {when(found['created_at'])} UTC", f"use as:    file:{found['id']}"]


def files_table(items: list[dict[str, Any]]) -> list[str]:
    from api.cli.term_view import table, when

    if not items:
        return ["no files (grpo files upload PATH --purpose dataset|model adds one)"]
    rows = [[item["id"], item["purpose"], item["status"], item["bytes"], when(item["created_at"]),
             item["filename"]] for item in items]
    return table(["ID", "PURPOSE", "STATUS", "BYTES", "CREATED", "FILENAME"], rows)


def _upload(client: Any, args: argparse.Namespace) -> Result:
    with upload_source(args.path) as (path, name):
        found = client.upload_file(path, args.purpose, name, args.prompt_field)
    return Result(found, "\n".join(file_lines(found)))


def _list(client: Any, _: argparse.Namespace) -> Result:
    items = client.list_files()
    return Result({"items": items}, "\n".join(files_table(items)))


def _show(client: Any, args: argparse.Namespace) -> Result:
    found = client.file(args.file_id)
    return Result(found, "\n".join(file_lines(found)))


def _remove(client: Any, args: argparse.Namespace) -> Result:
    removed = client.delete_file(args.file_id)
    return Result(removed, f"deleted {removed['id']} ({removed['filename']})")


def add_files_command(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    files = commands.add_parser(FILES_COMMAND, help="the team's uploaded datasets and models (file:ID)")
    actions = files.add_subparsers(dest="files_command", required=True)
    upload = actions.add_parser("upload", parents=[common_options()], help="upload a dataset file or a "
                                "model (a folder is packed to a tar.gz)")
    upload.add_argument("path", type=Path, help="a .jsonl/.json/.csv/.parquet file, a model's tar or tar.gz, "
                        "or a model folder")
    upload.add_argument("--purpose", required=True, choices=("dataset", "model"))
    upload.add_argument("--prompt-field", default=None, metavar="COLUMN",
                        help="a dataset's prompt column (default: prompt), remembered with the file: a "
                        "spec naming it without its own prompt_field uses it")
    upload.set_defaults(handler=_handler(_upload))
    listing = actions.add_parser("list", parents=[common_options()], help="the team's files, newest first")
    listing.set_defaults(handler=_handler(_list))
    for name, command, help_ in (("show", _show, "one file"), ("rm", _remove, "delete a file no unfinished "
                                                                              "job uses")):
        action = actions.add_parser(name, parents=[common_options()], help=help_)
        action.add_argument("file_id", metavar="ID")
        action.set_defaults(handler=_handler(command))


def _handler(command: Any) -> Any:
    def handle(args: argparse.Namespace) -> int:
        return call_api(args.api_url, args.api_key, args.json, lambda client: command(client, args))

    return handle
