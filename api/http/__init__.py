"""The web process's HTTP and WebSocket surface: routes, dependencies, auth, error mapping,
request-body middleware, submit-time checks, the Prometheus export and the dashboard's files.

May import: ``api.store``, ``api.streaming``, ``api.scheduling`` (its pure views and policy),
``api.schemas``, ``api.vocabulary``, ``api.domain.lifecycle``, ``api.settings``, ``api.domain.errors`` and
``grpo_core``'s spec, catalog and error modules. Never torch (the web app starts without it),
never ``api.cli`` or ``worker``.
"""
