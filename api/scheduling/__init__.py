"""Placing jobs on GPUs: the pure decision (``policy``), the scheduler process that carries it
out each tick (``scheduler``), the pure views of the cluster and the queue (``cluster_views``), and
the webhook sender and the storage sweep that run beside the scheduler in its process
(``webhook_sender``, ``storage_sweeper``).

May import: ``api.store``, ``api.vocabulary``, ``api.domain.lifecycle``, ``api.settings``,
``api.domain.errors``, ``api.schemas``, ``api.storage`` and ``api.artifacts.paths`` (the storage
sweep). ``policy`` and ``cluster_views`` import no I/O library.
Never ``api.http``, ``api.cli`` or ``worker`` (jobs are sent by task name).
"""
