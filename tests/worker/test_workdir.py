"""The job's process runs in an empty folder: what it needs from the worker's own folder must
reach it as absolute paths (the settings' roots, a relative SQLite file, the import path)."""

from __future__ import annotations

import os
from pathlib import Path

from api.settings import Settings
from worker.workdir import absolute_settings, job_environment, make_workdir


def test_relative_settings_become_absolute_from_the_workers_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = absolute_settings(Settings(database_url="sqlite:///./grpo.db", models_root=Path("models"),
                                          data_root=Path("./data"), artifacts_root=tmp_path / "a"))
    assert settings.database_url == f"sqlite:///{tmp_path / 'grpo.db'}"
    assert (settings.models_root, settings.data_root) == (tmp_path / "models", tmp_path / "data")
    assert settings.artifacts_root == tmp_path / "a"
    postgres = "postgresql+psycopg://u:secret@db:5432/grpo"
    assert absolute_settings(Settings(database_url=postgres)).database_url == postgres


def test_the_import_path_is_absolute_and_starts_with_this_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"plugins{os.pathsep}/opt/x")
    entries = job_environment()["PYTHONPATH"].split(os.pathsep)
    assert entries == [str(Path(__file__).resolve().parents[2]), str(tmp_path / "plugins"), "/opt/x"]
    workdir = make_workdir(tmp_path)
    assert workdir.is_dir() and not any(workdir.iterdir())
