"""Where a spec's model, dataset or reward model comes from: a ``SCHEME:LOCATION`` source string.

The core loads two schemes: ``path:`` (a local folder or file, resolved safely by
:mod:`grpo_core.io.paths`) and ``hf:`` (a hub id, checked here against the hub's own naming rules so
nothing that could be a URL, a shell word or a local path gets through). The service adds
``file:`` (an upload, by id) and ``job:`` (another job's model); their shapes are checked here, so
a reward's args (which the core validates for both) take them like the service's ``model.source``
(:func:`reward_model_source`), and the core can tell them apart and refuse to load them. Only the
string's shape is checked: whether it exists is the loaders' business.
"""

from __future__ import annotations

import re

SOURCE_PATTERN = re.compile(r"^(path|hf):(.+)$")
# Hub ids follow the hub's own rules: owner/name, each letters, digits, "-", "_" and ".", neither
# starting nor ending with "." or "-", no ".." or "--", 96 characters in all; then an optional
# @revision (a branch, tag or commit). Nothing that could be a URL, a shell word or a local path.
_HUB_PART = r"[A-Za-z0-9_](?:[\w.\-]*[A-Za-z0-9_])?"
HUB_ID_PATTERN = re.compile(rf"^(?P<id>{_HUB_PART}/{_HUB_PART})(?:@(?P<revision>[\w.\-]+(?:/[\w.\-]+)*))?$",
                            re.ASCII)
HUB_ID_MAX_LENGTH, HUB_REVISION_MAX_LENGTH = 96, 128


# An uploaded file of the service's (``POST /v1/files``), by its id: only the service resolves it
# (the worker fetches it from the object store), so ``grpo train`` refuses it.
FILE_SCHEME = "file"
FILE_ID_PATTERN = re.compile(r"^file-[0-9a-f]{24}$")


def file_source_id(source: str) -> str | None:
    """The id a ``file:ID`` source names (``"file:file-0a…"`` -> ``"file-0a…"``); None for a source
    of another scheme; ValueError for a malformed ``file:`` source."""
    scheme, _, location = source.partition(":")
    if scheme != FILE_SCHEME:
        return None
    if FILE_ID_PATTERN.match(location.strip()) is None:
        raise ValueError("file: sources look like 'file:file-' and 24 hex digits, the id POST /v1/files "
                         "gave the upload")
    return location.strip()


# Another job of the service's: its final model (job:ID) or a kept checkpoint (job:ID@STEP). Only
# the service resolves it (the worker, to that job's folder), so ``grpo train`` refuses it.
JOB_SCHEME = "job"
JOB_SOURCE_PATTERN = re.compile(r"^(\d{1,18})(?:@(\d{1,10}))?$")


def job_source(location: str) -> tuple[int, int | None]:
    """``"7"`` -> ``(7, None)`` (the job's final model), ``"7@40"`` -> ``(7, 40)`` (its checkpoint)."""
    match = JOB_SOURCE_PATTERN.match(location)
    if match is None or int(match.group(1)) < 1 or (match.group(2) is not None and int(match.group(2)) < 1):
        raise ValueError("job: sources look like 'job:ID' (its final model) or 'job:ID@STEP' (a checkpoint)")
    return int(match.group(1)), None if match.group(2) is None else int(match.group(2))


def named_job(source: str) -> tuple[int, int | None] | None:
    """The ``(job id, step or None)`` a ``job:`` source names; None for a source of another scheme;
    ValueError for a malformed ``job:`` source."""
    scheme, _, location = source.partition(":")
    if scheme != JOB_SCHEME:
        return None
    return job_source(location.strip())


def reward_model_source(source: str) -> str:
    """``source`` when it may name a reward's model: ``path:`` or ``hf:`` (which the core loads), or
    the service's ``file:ID`` or ``job:ID[@STEP]`` (the worker rewrites them to ``path:`` ones);
    ValueError saying what is wrong otherwise."""
    if file_source_id(source) is None and named_job(source) is None:
        split_source(source)
    return source


def split_source(source: str) -> tuple[str, str]:
    """``"path:/m"`` -> ``("path", "/m")``; raises ValueError for anything else."""
    match = SOURCE_PATTERN.match(source)
    if match is None:
        raise ValueError("must start with 'path:' or 'hf:'")
    scheme, rest = match.group(1), match.group(2).strip()
    if not rest:
        raise ValueError(f"'{scheme}:' needs a location after it")
    if scheme == "hf":
        _check_hub_id(rest)
    return scheme, rest


def _check_hub_id(location: str) -> None:
    match = HUB_ID_PATTERN.match(location)
    rules = ("hf: ids are 'owner/name' or 'owner/name@revision': letters, digits, '-', '_' and '.', "
             "not starting or ending with '.' or '-'")
    if match is None:
        raise ValueError(rules)
    hub_id, revision = match["id"], match["revision"] or ""
    if ".." in hub_id or "--" in hub_id or ".." in revision:
        raise ValueError(f"{rules}; no '..' or '--'")
    if len(hub_id) > HUB_ID_MAX_LENGTH or len(revision) > HUB_REVISION_MAX_LENGTH:
        raise ValueError(f"hf: ids are at most {HUB_ID_MAX_LENGTH} characters, revisions "
                         f"{HUB_REVISION_MAX_LENGTH}")
