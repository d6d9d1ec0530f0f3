"""The ``grpo`` command: its entry and parser (``main``), the database-side admin commands
(``admin``), the HTTP client and the commands built on it (``client``, ``monitor``), the pure
terminal rendering (``term_view``; ``cluster_view`` for ``grpo cluster`` and ``grpo queue``) and
``grpo dev``, which runs the whole stack locally.

May import everything in ``api``; ``monitor``, ``client``, ``term_view`` and ``cluster_view`` use
only the HTTP API (plus ``api.vocabulary``), so they work against a remote deployment.
"""
