"""Loading ``hf:`` sources by hub id, and only by hub id.

``from_pretrained`` and ``load_dataset`` read a local folder (or file) when one of the id's name
exists relative to the working directory, so ``hf:outside/m`` could read a checkout's folder. The
service runs each job in an empty working directory; here, the loaders also refuse an id that
names something local, wherever they run (``grpo train`` too). A hub that cannot be reached is
:class:`~grpo_core.errors.SourceUnavailable` (the spec is fine, the network or cache is not);
every other failure is the spec's (an unknown id, a missing split); :mod:`grpo_core.io.source_errors` tells
them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from grpo_core.errors import GRPOError, SourceUnavailable, SpecError
from grpo_core.io.source_errors import unreachable

__all__ = ["is_hub_location", "load_from_hub", "split_revision"]

T = TypeVar("T")


def split_revision(location: str) -> tuple[str, str | None]:
    """``"owner/name@rev"`` -> ``("owner/name", "rev")``; a folder has no revision."""
    if is_hub_location(location):
        name, _, revision = location.partition("@")
        return name, (revision or None)
    return location, None


def is_hub_location(location: str) -> bool:
    """A resolved location is a hub id unless it is an absolute path: ``path:`` sources are always
    resolved to one (:mod:`grpo_core.io.paths`), and no hub id can start with ``/``."""
    return not Path(location).is_absolute()


def load_from_hub(location: str, field: str, what: str, load: Callable[[str, str | None], T]) -> T:
    """``load(hub_id, revision)``, refusing an id that names a local file or folder; a failure is
    :class:`SourceUnavailable` when the hub was unreachable, else a :class:`SpecError` at ``field``
    saying ``what`` could not be loaded."""
    name, revision = split_revision(location)
    if Path(name).exists():
        raise SpecError(field, f"'{name}' is read from the hub only, and a local path of that name "
                               "exists here: refusing to read it")
    try:
        return load(name, revision)
    except GRPOError:
        raise
    except Exception as exc:  # transformers and datasets raise many types for one cause
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if unreachable(exc):
            raise SourceUnavailable(field, f"could not load {what} '{location}': the source cannot be "
                                           f"reached: {reason}") from exc
        raise SpecError(field, f"could not load {what} '{location}': {reason}") from exc
