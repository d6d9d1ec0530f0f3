"""The token-bucket arithmetic (``api.limits.rate_limits``) against hand-computed values; the Redis
script that mirrors it is exercised over HTTP in tests/api/test_rate_limits.py."""

from __future__ import annotations

import pytest

from api.limits.rate_limits import Bucket, bucket_kind, charge_tokens, cost_of, take_tokens

BUCKET = Bucket(rate=2.0, burst=10)  # two tokens a second, ten at most


def test_a_new_bucket_is_full_and_refills_at_its_rate_up_to_its_burst() -> None:
    assert take_tokens(None, 0.0, BUCKET, 1) == (9.0, 0.0)
    assert take_tokens(3.0, 1.5, BUCKET, 4) == (2.0, 0.0)  # 3 + 1.5 s x 2 = 6, minus 4
    assert take_tokens(9.0, 60.0, BUCKET, 1) == (9.0, 0.0)  # capped at 10 before the take
    assert take_tokens(5.0, -1.0, BUCKET, 1) == (4.0, 0.0)  # a clock step back refills nothing


def test_a_request_the_bucket_cannot_pay_takes_nothing_and_waits_for_the_difference() -> None:
    assert take_tokens(0.5, 0.0, BUCKET, 1) == (0.5, 0.25)  # half a token at 2/s
    assert take_tokens(1.0, 0.0, BUCKET, 5) == (1.0, 2.0)
    assert take_tokens(-10.0, 0.0, BUCKET, 1) == (-10.0, 5.5)  # in debt: 11 tokens to go


def test_a_charge_goes_into_debt_as_deep_as_the_work_was() -> None:
    assert charge_tokens(4.0, 0.0, BUCKET, 3) == 1.0
    assert charge_tokens(4.0, 0.0, BUCKET, 9) == -5.0
    assert charge_tokens(4.0, 1.0, BUCKET, 100) == -94.0  # refilled to 6 first
    assert charge_tokens(None, 0.0, BUCKET, 2) == 8.0


@pytest.mark.parametrize("size, cost", [(0, 1), (8_191, 1), (8_192, 2), (50_000, 7), (1_048_576, 10)])
def test_a_request_costs_one_token_plus_one_per_8_kib_at_most_a_burst(size: int, cost: int) -> None:
    assert cost_of(size, BUCKET) == cost


def test_a_yaml_body_weighs_four_times() -> None:
    assert cost_of(8_192, Bucket(rate=1.0, burst=100), 4) == 5


def test_reads_are_gets_and_streams_everything_else_writes() -> None:
    assert [bucket_kind("http", method) for method in ("GET", "HEAD", "POST", "PATCH", "PUT", "DELETE")] == [
        "reads", "reads", "writes", "writes", "writes", "writes"]
    assert bucket_kind("websocket", None) == "reads"
