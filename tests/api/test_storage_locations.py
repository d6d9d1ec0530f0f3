"""``GRPO_STORAGE_URL`` read into a store: which kind, where, and a bad URL refused when the
settings load (api.storage.locations, api.settings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from api.settings import Settings
from api.storage import Location, open_store, parse_location
from api.storage.local import LocalStore


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://grpo-artifacts", Location("s3", "grpo-artifacts", "")),
    ("s3://grpo-artifacts/", Location("s3", "grpo-artifacts", "")),
    ("s3://grpo.prod-1/team/stack-a/", Location("s3", "grpo.prod-1", "team/stack-a/")),
    ("file:///srv/grpo/artifacts", Location("file", "", "/srv/grpo/artifacts")),
    ("file://localhost/srv/a%20b", Location("file", "", "/srv/a b")),
    ("/srv/grpo", Location("file", "", "/srv/grpo")),
])
def test_a_storage_url_names_a_bucket_or_a_folder(url: str, expected: Location) -> None:
    assert parse_location(url) == expected


def test_a_relative_folder_is_taken_from_the_working_directory(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_location("artifacts") == Location("file", "", str(tmp_path / "artifacts"))


@pytest.mark.parametrize("url", ["gs://bucket/x", "s3://", "s3://UPPER", "s3://ab", "s3://b_c/x",
                                 "s3://bucket/../x", "file://otherhost/x", "", "http://minio:9000/b"])
def test_a_bad_storage_url_is_refused_at_settings_load(url: str) -> None:
    with pytest.raises(ValueError):
        parse_location(url)
    with pytest.raises(ValidationError, match="storage_url"):
        Settings(storage_url=url)


def test_unset_the_store_is_the_artifacts_folder_as_before(tmp_path: Path) -> None:
    settings = Settings(artifacts_root=tmp_path / "artifacts")
    store = open_store(settings.storage_location)
    assert isinstance(store, LocalStore) and store.root == tmp_path / "artifacts"
    # The same path the worker writes today (api.artifacts.paths): nothing moves for a deployment.
    from api.artifacts.paths import model_dir

    store.put_stream("jobs/4/model/config.json", [b"{}"])
    assert (model_dir(settings, 4) / "config.json").read_bytes() == b"{}"


def test_a_bucket_url_opens_an_s3_store_configured_by_the_aws_variables() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "eu-west-3"}
    store = open_store("s3://grpo-artifacts/stack-a", env=env)
    assert (store.bucket, store.prefix) == ("grpo-artifacts", "stack-a/")
    assert store.client.meta.endpoint_url == "http://127.0.0.1:9"
    assert store.client.meta.region_name == "eu-west-3"
    assert store.client.meta.config.s3["addressing_style"] == "path"  # MinIO serves buckets as paths
    credentials = store.client._request_signer._credentials
    assert (credentials.access_key, credentials.secret_key) == ("k", "s")
