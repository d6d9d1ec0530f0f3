"""The heartbeat a worker advertises, read back by the scheduler, the API and /metrics."""

from __future__ import annotations

from api.vocabulary import Heartbeat


def test_a_heartbeat_round_trips_through_its_json() -> None:
    beat = Heartbeat(worker_id="h:1", pool="a100", gpus=4, gpu_model="A100", gpu_memory_mb=81920,
                     memory_mb=1024, hostname="h", jobs={7: [0, 2], 9: [3]})
    assert Heartbeat.from_json(beat.to_json()) == beat
    assert beat.free_devices == [1]
    assert '"free_devices":[1]' in beat.to_json()  # what a reader of the raw key finds


def test_fields_of_another_version_are_ignored_and_missing_ones_default() -> None:
    beat = Heartbeat.from_json(b'{"worker_id": "w", "gpus": 2, "future_field": [1, 2]}')
    assert beat == Heartbeat(worker_id="w", pool="default", gpus=2)


def test_a_heartbeat_without_a_worker_id_is_not_counted() -> None:
    assert Heartbeat.from_json('{"pool": "default", "gpus": 8}') is None
    assert Heartbeat.from_json('{"worker_id": "", "gpus": 8}') is None
