"""The Celery side of the service: a worker per GPU (pool queue) that claims jobs, runs
``grpo_core`` in a fresh child process and reports to SQL (the record) and Redis (the live view).

Only :mod:`worker.celery_app` builds anything at import time; it is the worker's entrypoint.
"""
