"""The dashboard's files as the API serves them: the page at ``/``, its modules and Plotly.js under
``/static/``, nothing else (no path reaches outside the table of files), with the right types and
cache headers. The page's behaviour is tested in a browser (``tests/e2e/test_dashboard.py``)."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from api.http.routes.dashboard import DASHBOARD_DIR, plotly_js_path

OWN_FILES = sorted(path.name for path in DASHBOARD_DIR.iterdir() if path.suffix in (".html", ".js", ".css"))
IMPORT = re.compile(r'^import (?:\{[\w, ]+\}|\* as \w+) from "\./([\w.-]+)";$')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, api_settings_factory, serve_api) -> Iterator[str]:
    # The files need neither database nor key: the URL is never connected to.
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'unused.db'}"
    with serve_api(api_settings_factory(url)) as live:
        yield live.http_url


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, trust_env=False, timeout=10) as http:
        yield http


def raw_get(server: str, path: str) -> int:
    """The status of ``GET path`` sent exactly as written (httpx would resolve ``..`` first)."""
    parts = urlsplit(server)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_page_is_served_at_the_root_without_a_key(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="/static/app.js"></script>' in page.text
    assert '<script src="/static/plotly.min.js"></script>' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "://" not in page.text  # no CDN: every file comes from this origin


@pytest.mark.parametrize("name", OWN_FILES)
def test_every_own_file_is_served_with_its_type(client: httpx.Client, name: str) -> None:
    response = client.get(f"/static/{name}")
    assert response.status_code == 200
    kind = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
    assert response.headers["content-type"] == f"{kind}; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    assert response.content == (DASHBOARD_DIR / name).read_bytes()


def test_plotly_comes_from_the_installed_package_and_is_cached(client: httpx.Client) -> None:
    response = client.get("/static/plotly.min.js")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/javascript; charset=utf-8"
    assert "max-age=86400" in response.headers["cache-control"]
    assert response.content == plotly_js_path().read_bytes()
    again = client.get("/static/plotly.min.js", headers={"If-None-Match": response.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


@pytest.mark.parametrize("path", ["/static/../settings.py", "/static/..%2Fsettings.py",
                                  "/static/%2e%2e%2fapi%2fsettings.py", "/static/dashboard.py",
                                  "/static/nope.js", "/static/", "/static/.%2Fapp.js",
                                  "/static/package_data%2Fplotly.min.js"])
def test_nothing_outside_the_table_is_served(server: str, path: str) -> None:
    assert raw_get(server, path) == 404


def test_every_module_import_is_a_served_file() -> None:
    for name in OWN_FILES:
        lines = (DASHBOARD_DIR / name).read_text().splitlines()
        for line in (line for line in lines if line.startswith("import ")):
            match = IMPORT.match(line)
            assert match is not None and match.group(1) in OWN_FILES, f"{name}: {line}"


def test_modules_never_write_html_and_stay_small() -> None:
    """Data reaches the DOM as text only (``dom.el``); a module does one job."""
    for path in Path(DASHBOARD_DIR).glob("*.js"):
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{path.name} uses {sink}"
        assert len(text.splitlines()) <= 300, path.name


def test_the_api_reference_is_swagger_ui_from_the_installed_package(client: httpx.Client) -> None:
    from api.http.routes.dashboard import swagger_ui_dir

    page = client.get("/docs")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert "://" not in page.text  # no CDN
    for name in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert f"/static/{name}" in page.text
        served = client.get(f"/static/{name}")
        assert served.status_code == 200 and served.content == (swagger_ui_dir() / name).read_bytes()
    assert client.get("/redoc").status_code == 404
