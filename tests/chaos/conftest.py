"""Faults injected into the real stack (Postgres, Redis, Celery worker and scheduler processes):
the fixtures of :mod:`service_stack`. Each test is bounded in time by its waits."""

from service_stack import *  # noqa: F403 - fixtures and a hook, found by name
