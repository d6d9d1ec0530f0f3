"""The dashboard: ``/`` is its one HTML page, ``/static/{name}`` its ES modules and stylesheet
(``api/http/dashboard/``) and the Plotly.js that the installed ``plotly`` package ships, so a browser
fetches nothing from a CDN. ``/docs``, the API reference, is Swagger UI served the same way from
the installed ``swagger-ui-py`` package: it renders where no CDN can be reached. No auth
here: these files hold no data; the page asks ``/v1`` with the user's key, and the API scopes
every answer to it.

A requested name is only ever looked up in the table of servable files, never joined to a path,
so nothing outside that table can be reached (``/static/../settings.py`` is a 404).
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from api.domain.errors import NotFound

router = APIRouter(include_in_schema=False)

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
PLOTLY_JS = "plotly.min.js"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8"}
# Our files change with each release: the browser revalidates (a 304 costs one round trip).
# Plotly.js changes only with the installed package, and it is 4.8 MB: kept for a day.
OWN_CACHE = "no-cache"
PLOTLY_CACHE = "public, max-age=86400"
# Plotly sets inline styles on its SVG; no script runs but ours and Plotly's, from this origin.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
                           "base-uri 'none'; frame-ancestors 'none'")


SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")


def swagger_ui_dir() -> Path:
    """The Swagger UI files (5.x: it reads OpenAPI 3.1, which FastAPI writes) that the
    ``swagger-ui-py`` package ships, found without importing it."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed; /docs needs its files")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def plotly_js_path() -> Path:
    """The ``plotly`` package's bundled Plotly.js, found without importing the package."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the plotly package is not installed; the dashboard needs its plotly.min.js")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / PLOTLY_JS


@lru_cache
def servable_files() -> dict[str, tuple[Path, str]]:
    """Every name ``/static/`` answers: file and Cache-Control. Listed once per process."""
    files = {path.name: (path, OWN_CACHE) for path in sorted(DASHBOARD_DIR.iterdir())
             if path.is_file() and path.suffix in MEDIA_TYPES}
    files[PLOTLY_JS] = (plotly_js_path(), PLOTLY_CACHE)
    for name in SWAGGER_FILES:  # change only with the installed package, like Plotly.js
        files[name] = (swagger_ui_dir() / name, PLOTLY_CACHE)
    return files


def _send(request: Request, path: Path, cache_control: str, headers: dict[str, str] | None = None
          ) -> Response:
    stat = path.stat()
    etag = '"' + hashlib.sha1(f"{stat.st_mtime_ns}-{stat.st_size}".encode()).hexdigest()[:20] + '"'
    caching = {"Cache-Control": cache_control, "ETag": etag, **(headers or {})}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=caching)
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=caching)


@router.get("/")
def index(request: Request) -> Response:
    return _send(request, DASHBOARD_DIR / "index.html", OWN_CACHE,
                 {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"})


@router.get("/docs")
def api_reference(request: Request) -> Response:
    return _send(request, DASHBOARD_DIR / "docs.html", OWN_CACHE,
                 {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"})


@router.get("/static/{name}")
def static_file(name: str, request: Request) -> Response:
    found = servable_files().get(name)
    if found is None:
        raise NotFound(f"no static file '{name}'")
    return _send(request, *found, {"X-Content-Type-Options": "nosniff"})
