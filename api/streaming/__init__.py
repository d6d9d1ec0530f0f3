"""A job's live stream for WebSocket readers: per-job hubs that tail Redis once per process,
cursors that drop duplicates, the SQL catch-up and the client message shapes.

May import: ``api.store``, ``api.schemas``, ``api.lifecycle``, ``api.vocabulary``. Never
``api.http`` (the route is a thin adapter over this package) or ``api.cli``.
"""
