"""A job's live stream for WebSocket readers (``WS /v1/jobs/{id}/stream``), whole: the route
authenticates and accepts the socket, then hands it to :func:`serve`.

- ``connection``: :func:`serve`, the entry point (backlog, then the job's hub, until the end;
  returns the close code), and :func:`hubs_for`, the app's hubs.
- ``fanout``: one reader per job per process; subscribers with bounded queues; a ring for late joiners.
- ``catch_up``: the SQL backlog and re-reads, paged.
- ``subscriber``: one connection's cursor and queue; ``cursor``: stream ids and duplicate-dropping;
  ``messages``: stream entries → client messages and their encoding; ``config``: the tunables.

May import: ``api.store``, ``api.schemas``, ``api.domain.lifecycle``, ``api.vocabulary``, ``api.settings``
and starlette. Never ``api.http`` (the route is a thin adapter over this package) or ``api.cli``.
"""

from api.streaming.connection import hubs_for, serve
from api.streaming.cursor import Cursor

__all__ = ["Cursor", "hubs_for", "serve"]
