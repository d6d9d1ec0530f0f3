"""The real service stack's fixtures (:mod:`service_stack`, shared with ``tests/chaos``)."""

from service_stack import *  # noqa: F403 - fixtures and a hook, found by name
