"""The job's process runs in an empty working directory of its own (under its attempt folder), so
nothing in a spec can reach the worker's own folder through a relative name: ``from_pretrained``
and ``load_dataset`` would read ``./outside/m`` for ``hf:outside/m`` (grpo_core.io.hub_loading refuses such
ids too). Everything the job needs from the worker's folder travels as absolute paths: the
settings' roots, a SQLite database's file, and the import path.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from api.settings import Settings

# The folder that holds the `worker` package (and `api`, `grpo_core`): a checkout or site-packages.
_CODE_ROOT = Path(__file__).resolve().parents[1]


def make_workdir(attempt_folder: Path) -> Path:
    workdir = attempt_folder / "workdir"
    workdir.mkdir(mode=0o700)
    return workdir


def absolute_settings(settings: Settings) -> Settings:
    """``settings`` with every path (and a SQLite file's name) made absolute from this process's
    working directory, which the job's process does not share."""
    update: dict[str, object] = {name: value.resolve() for name, value in settings if isinstance(value, Path)}
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:" \
            and not url.database.startswith("file:"):
        update["database_url"] = url.set(database=str(Path(url.database).resolve())).render_as_string(
            hide_password=False)
    return settings.model_copy(update=update)


def job_environment() -> dict[str, str]:
    """This process's environment with an absolute import path: the code root first, then
    ``PYTHONPATH``'s entries made absolute (a relative one would now mean the empty folder)."""
    entries = [str(_CODE_ROOT)]
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry:
            absolute = str(Path(entry).resolve())
            entries += [] if absolute in entries else [absolute]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entries)}
