"""The web process's entrypoint and composition root.

``create_app(settings)`` builds an app (tests build several with different settings); the
module attribute ``app`` is built on first access, so ``uvicorn api.main:app`` works while a
bare import still builds nothing. ``uvicorn --factory api.main:create_app`` works too.
Nothing here imports torch: the web process stays small and starts fast.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from api.http import access_log, openapi_bodies, openapi_stream
from api.http.error_responses import BodySizeLimit, install_error_handlers
from api.http.input_guard import InputGuard
from api.http.routes import build_router
from api.http.upload_body import UPLOAD_ROUTES
from api.security.secret_box import SecretBox
from api.settings import Settings, get_settings
from api.store import bus, webhooks
from api.store.db import session_scope

log = logging.getLogger(__name__)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    # Stored webhook secrets must be readable with the key given: a missing or changed
    # GRPO_SECRET_KEY stops the process here, saying so, not at the first delivery.
    # A database that is down or behind its schema is not a reason to refuse to start: /readyz
    # says so, and the scheduler's start makes the same check before any delivery is signed.
    try:
        with session_scope(settings.database_url) as session:
            webhooks.secrets_readable(session, SecretBox.from_key(settings.secret_key), reseal=False)
    except SQLAlchemyError as exc:
        log.warning("webhook secrets not checked at start: the database did not answer (%s)",
                    type(exc).__name__)
    # Its timeouts exceed the stream's XREAD BLOCK, so a blocked read is never taken for a dead socket.
    app.state.redis = bus.connect_async(settings)
    # Sessions commit in worker threads (sync routes and dependencies), so what they staged for
    # live readers is published from there, through a sync client of its own.
    publisher_client = bus.connect(settings)
    app.state.publish = bus.publisher(publisher_client, settings.redis_keys, settings.stream_maxlen)
    app.state.sync_redis = publisher_client  # for checks made in worker threads (live workers)
    # Everything built so far lives as long as the process: out of the collector's way. A full
    # collection otherwise walks every module, route and schema object, 70-300 ms holding the
    # interpreter, and requests that parse megabyte specs make the collector run that often.
    gc.freeze()
    # Specs are parsed in threads (api.http.spec_intake): a thread asking for the interpreter gets
    # it within 1 ms instead of 5, so the event loop's turn comes between their steps.
    sys.setswitchinterval(0.001)
    try:
        yield
    finally:
        await app.state.redis.aclose()
        publisher_client.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    # /docs is served from the installed Swagger UI files (api.http.routes.dashboard), not a CDN.
    app = FastAPI(title="GRPO job service", version="0.1.0", lifespan=_lifespan, docs_url=None,
                  redoc_url=None,
                  description="Submit GRPO fine-tuning jobs and follow their training signals. "
                              "Errors are `{\"error\": {\"code\", \"message\", \"param\"}}`.")
    app.state.settings = settings
    access_log.install()  # uvicorn logs request paths: no credential in a query reaches them
    install_error_handlers(app)
    # Text no column holds (NUL, lone surrogates) in a path, query or JSON body: a 422 before any
    # route runs. Added first, so it runs inside the size guard, on a body already bounded.
    app.add_middleware(InputGuard, streamed=UPLOAD_ROUTES)
    # An upload streams to a spool file under its own limits (api.http.upload_body), never buffered.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes, streamed=UPLOAD_ROUTES)
    app.include_router(build_router())
    openapi_stream.install(app)
    openapi_bodies.install(app)  # after: it adds to the document openapi_stream builds
    return app


@lru_cache
def _default_app() -> FastAPI:
    return create_app()


def __getattr__(name: str) -> Any:
    if name == "app":
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
