"""How a run's finished folders are put in place and its old checkpoints removed
(:class:`Publisher`). Torch-free: the service's worker subclasses it in its main process
(:mod:`worker.fencing`), which never imports torch."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Publisher:
    """How a run's finished folders are put in place and its old checkpoints removed. This one,
    ``grpo train``'s, writes each checkpoint beside the others (``staging`` None) and renames it
    over any folder of that name. A caller whose run may be superseded while it writes (a service
    that hands a job to another worker when this one goes silent) gives a ``staging`` folder of
    the run's own and checks, in :meth:`publish` and :meth:`remove`, that the run still owns its
    folder before it changes anything there."""

    staging: Path | None = None

    def publish(self, tmp: Path, final: Path) -> None:
        """``tmp`` (complete) becomes ``final``."""
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    def remove(self, what: str, remove: Callable[[], T]) -> T:
        """``remove()``: deletes published folders (``what`` names them)."""
        return remove()
