"""A run from spec to end: build and check its parts (``components``), the training loop
(``trainer``) reporting through ``callbacks`` and ``tracking``, checkpoints (``checkpoint``),
ranks started on one machine (``launch``) that never outlive their parent (``lifetime``), and
``grpo train`` without the service (``local_run``).

May import: every other sub-package of ``grpo_core``; nothing imports this package but
``grpo_core.cli`` and the service's worker.
"""
