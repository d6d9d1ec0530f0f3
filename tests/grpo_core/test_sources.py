"""Telling a source that cannot be reached (``source_unavailable``) from one that is wrong
(``invalid_spec``), on the shapes transformers and datasets raise: the cause is in the chain."""

from __future__ import annotations

import pytest

from grpo_core.io.source_errors import unreachable


class LocalEntryNotFoundError(FileNotFoundError):
    """huggingface_hub's, by name: not cached and the hub could not be asked."""


def wrapped(cause: BaseException, message: str = "transformers could not load the files") -> OSError:
    try:
        raise cause
    except BaseException as inner:
        try:
            raise OSError(message) from inner
        except OSError as outer:
            return outer


@pytest.mark.parametrize("error", [
    wrapped(LocalEntryNotFoundError("no cache")),
    wrapped(ConnectionError("connection refused")),
    wrapped(TimeoutError()),
    OSError("We couldn't connect to 'https://huggingface.co' to load the files"),
])
def test_an_unreachable_source_is_recognised_through_the_chain(error: BaseException) -> None:
    assert unreachable(error)


@pytest.mark.parametrize("error", [
    OSError("someone/typo is not a local folder and is not a valid model identifier"),
    wrapped(ValueError("Unrecognized model in folder")),
    wrapped(FileNotFoundError("config.json")),
])
def test_a_wrong_source_is_not_taken_for_an_unreachable_one(error: BaseException) -> None:
    assert not unreachable(error)
