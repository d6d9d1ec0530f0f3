"""What ``POST /v1/files`` refuses, through the real service: each dataset and model-archive
check (422 naming the field and the first bad row or member), the size limits (413), malformed
forms; and that no refusal leaves a spool file, a row or an object behind."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from test_files import ROWS, TINY_MODEL, model_archive, upload, uploaded

from api.storage import open_store


@pytest.fixture(scope="module")
def spool_server(api_server, api_settings_factory, serve_api, tmp_path_factory):
    """A server of the module's database whose uploads spool into a folder the tests look into,
    with a dataset limit of 4 KiB."""
    spool = tmp_path_factory.mktemp("spool")
    settings = api_settings_factory(api_server.settings.database_url, upload_spool_dir=spool,
                                    max_dataset_upload_bytes=4096)
    with serve_api(settings) as server:
        yield server, spool


@pytest.fixture
def alpha(spool_server, client_for, team_keys):
    server, spool = spool_server
    client = client_for(team_keys.alpha, server)
    before = {item["id"] for item in client.get("/v1/files").json()["items"]}
    yield client
    assert list(spool.iterdir()) == []  # every upload's spool file is removed, refused or not
    after = {item["id"] for item in client.get("/v1/files").json()["items"]}
    for file_id in after - before:
        client.delete(f"/v1/files/{file_id}")


def refused(client, name: str, content: bytes, purpose: str = "dataset", status: int = 422,
            **fields: str) -> dict:
    before = client.get("/v1/files").json()["items"]
    response = upload(client, name, content, purpose, **fields)
    assert response.status_code == status, response.text
    assert client.get("/v1/files").json()["items"] == before  # no row left behind
    return response.json()["error"]


@pytest.mark.parametrize("name, content, param, words", [
    ("rows.jsonl", b'{"prompt": "a"}\n{"prompt": \n', "file", "line 2 is not valid JSON"),
    ("rows.jsonl", b'{"prompt": "a"}\n[1]\n', "file", "line 2 is not a JSON object"),
    ("rows.jsonl", b'{"prompt": "a"}\n{"question": "b"}\n', "prompt_field", "row 1 has no 'prompt' column"),
    ("rows.jsonl", b'{"prompt": "   "}\n', "file", "row 0: 'prompt' must be a non-empty string"),
    ("rows.jsonl", b'{"prompt": [{"role": "robot", "content": "x"}]}\n', "file", "role is 'robot'"),
    ("rows.jsonl", b"\n\n", "file", "the dataset has no rows"),
    ("rows.json", b'{"prompt": "a"}', "file", "must hold a list of objects"),
    ("rows.json", b'[{"prompt": "a"}, 3]', "file", "row 1 is not a JSON object"),
    ("rows.csv", b"prompt,answer\na,1\n,2\n", "file", "row 1: 'prompt' must be a non-empty string"),
    ("rows.csv", b"prompt\na,extra\n", "file", "row 0 has more fields than the header"),
    ("rows.csv", b"prompt\n\xff\xfe\n", "file", "not UTF-8"),
    ("rows.parquet", b"PAR1 not really", "file", "could not read the parquet file"),
    ("rows.txt", b'{"prompt": "a"}\n', "file", "a dataset is a .jsonl, .json"),
], ids=lambda value: value if isinstance(value, str) and "." in value and len(value) < 14 else None)
def test_a_bad_dataset_is_refused_naming_the_first_bad_row(alpha, name, content, param, words) -> None:
    error = refused(alpha, name, content)
    assert error["param"] == param and words in error["message"], error


def test_every_dataset_format_and_the_chat_shape_are_accepted(alpha, tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["2+3?", "hi"], "answer": ["5", "x"]}), tmp_path / "rows.parquet")
    for name, content in (("rows.jsonl", ROWS), ("rows.json", b'[{"prompt": "a"}, {"prompt": "b"}]'),
                          ("rows.csv", b"prompt,answer\n2+3?,5\n"),
                          ("rows.parquet", (tmp_path / "rows.parquet").read_bytes())):
        assert uploaded(alpha, name, content)["format"] == name.rsplit(".", 1)[1]
    custom = upload(alpha, "q.jsonl", b'{"question": "2+3?"}\n', prompt_field="question")
    assert custom.status_code == 201, custom.text


def archive(members: list[tuple[tarfile.TarInfo, bytes | None]], base: Path | None = TINY_MODEL) -> bytes:
    """A tar.gz of ``base``'s files (None: none) plus ``members``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(base.iterdir()) if base else ():
            tar.add(path, arcname=path.name)
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def without(*names: str) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [(member(path.name), path.read_bytes()) for path in sorted(TINY_MODEL.iterdir())
            if path.name not in names]


@pytest.mark.parametrize("content, words", [
    (archive([(member("pytorch_model.bin"), b"\x80\x04")]), "'pytorch_model.bin' holds pickled weights"),
    (archive([(member("extra/optimizer.pt"), b"\x80\x04")]), "'extra/optimizer.pt' holds pickled weights"),
    (archive([(member("modeling_evil.py"), b"import os")]), "'modeling_evil.py' is Python code"),
    (archive([(member("weights.safetensors", tarfile.SYMTYPE, "/etc/passwd"), None)]), "is a link"),
    (archive([(member("hard", tarfile.LNKTYPE, "config.json"), None)]), "'hard' is a link"),
    (archive([(member("../escape.json"), b"{}")]), "'../escape.json' has a '..'"),
    (archive([(member("/etc/cron.d/x"), b"x")]), "'/etc/cron.d/x' has an absolute name"),
    (archive([(member("dev", tarfile.CHRTYPE), None)]), "'dev' is a device"),
    (archive([(member("fifo", tarfile.FIFOTYPE), None)]), "'fifo' is a device, pipe"),
    (archive(without("config.json"), base=None), "no config.json"),
    (archive(without("model.safetensors"), base=None), "no *.safetensors weights"),
    (archive(without("tokenizer.json", "tokenizer_config.json"), base=None), "no tokenizer files"),
    (archive([*without("config.json"), (member("config.json"), b"{not json")], base=None),
     "config.json is not valid JSON"),
    (b"just some bytes, not a tar", "not a readable tar"),
    (model_archive()[:2000], "not a readable tar"),
], ids=["bin", "nested-pt", "code", "symlink", "hardlink", "dotdot", "absolute", "device", "fifo",
        "no-config", "no-weights", "no-tokenizer", "bad-config", "not-tar", "truncated"])
def test_a_bad_model_archive_is_refused_naming_the_member(alpha, content, words) -> None:
    error = refused(alpha, "model.tar.gz", content, "model")
    assert error["param"] == "file" and words in error["message"], error


def test_a_model_archive_in_either_layout_is_accepted(alpha) -> None:
    for content in (model_archive(), model_archive(top="my-model/"), model_archive(gzip=False)):
        assert uploaded(alpha, "model.tar", content, "model")["status"] == "ready"


def test_size_limits_and_malformed_forms(alpha, spool_server) -> None:
    big = b'{"prompt": "' + b"x" * 5000 + b'"}\n'
    error = refused(alpha, "big.jsonl", big, status=413)
    assert error["param"] == "file" and "4096 bytes for dataset" in error["message"]
    # The same bytes are within a model's limit: refused for what they are, not for their size.
    as_model = upload(alpha, "big.jsonl", big, "model")
    assert as_model.status_code == 422 and "not a readable tar" in as_model.json()["error"]["message"]
    for data, files, param in (({"purpose": "weights"}, {"file": ("a.jsonl", ROWS)}, "purpose"),
                               ({}, {"file": ("a.jsonl", ROWS)}, "purpose"),
                               ({}, {"purpose": (None, "dataset")}, "file"),  # multipart, no file part
                               ({"purpose": "dataset"}, {"other": ("x", b"")}, "other"),
                               ({"purpose": "dataset", "team": "beta"}, {"file": ("a.jsonl", ROWS)}, "team"),
                               ({"purpose": "model", "prompt_field": "q"},
                                {"file": ("m.tar", model_archive())}, "prompt_field")):
        response = alpha.post("/v1/files", data=data, files=files)
        assert response.status_code == 422 and response.json()["error"]["param"] == param, response.text
    not_multipart = alpha.post("/v1/files", json={"purpose": "dataset"})
    assert not_multipart.status_code == 422 and not_multipart.json()["error"]["param"] == "body"


def test_a_model_whose_files_unpack_past_the_limit_is_refused(api_server, api_settings_factory,
                                                              serve_api, client_for, team_keys) -> None:
    settings = api_settings_factory(api_server.settings.database_url, upload_max_unpacked_bytes=200_000)
    with serve_api(settings) as server:
        zeros = archive([(member("padding.safetensors"), bytes(300_000))], base=None)  # gzips to ~300 bytes
        assert len(zeros) < 200_000
        response = upload(client_for(team_keys.alpha, server), "m.tar.gz", zeros, "model")
        assert response.status_code == 422 and "unpack to more than 200000 bytes" in response.text


def test_a_store_that_fails_leaves_the_file_as_error(api_server, api_settings_factory, serve_api,
                                                     client_for, team_keys, tmp_path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the store's folder should be")
    settings = api_settings_factory(api_server.settings.database_url, storage_url=str(blocked))
    with serve_api(settings) as server:
        client = client_for(team_keys.alpha, server)
        response = upload(client, "rows.jsonl", ROWS)
        assert response.status_code == 503 and response.headers["retry-after"], response.text
        [left] = [item for item in client.get("/v1/files").json()["items"] if item["status"] == "error"]
        assert client.get(f"/v1/files/{left['id']}/content").status_code == 409
        assert client.delete(f"/v1/files/{left['id']}").status_code == 200


def test_a_json_array_past_the_whole_read_bound_must_come_as_jsonl(alpha, monkeypatch) -> None:
    monkeypatch.setattr("api.uploads.datasets.MAX_WHOLE_FILE_BYTES", 100)
    rows = [{"prompt": f"question {index}"} for index in range(10)]
    error = refused(alpha, "rows.json", json.dumps(rows).encode())
    assert error["param"] == "file" and "upload a larger one as .jsonl" in error["message"]
    as_lines = "".join(json.dumps(row) + "\n" for row in rows).encode()  # the same rows, line by line
    assert uploaded(alpha, "rows.jsonl", as_lines)["bytes"] == len(as_lines)


def test_a_file_deleted_while_it_is_stored_leaves_no_object(alpha, spool_server, monkeypatch) -> None:
    """A DELETE that lands between the row's insert and the object's put (the row is
    ``uploading``): the upload answers 404 and takes its object away again."""
    from api.storage.local import LocalStore
    from api.store import files
    from api.store.db import session_scope

    server, _ = spool_server
    stored: list[str] = []
    put_file = LocalStore.put_file

    def deleted_meanwhile(store, key, path):
        with session_scope(server.settings.database_url) as session:
            files.delete_file(session, key.removeprefix("files/"), None)
        stored.append(key)
        return put_file(store, key, path)

    monkeypatch.setattr(LocalStore, "put_file", deleted_meanwhile)
    error = refused(alpha, "rows.jsonl", ROWS, status=404)
    assert "deleted while it was being stored" in error["message"]
    assert stored and not open_store(server.settings.storage_location).exists(stored[0])
