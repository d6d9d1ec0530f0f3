"""Reading TensorBoard event files back in tests, without TensorBoard: each file is a sequence
of TFRecords (length, its CRC, an ``Event`` protobuf, its CRC); tensorboardX ships the protobuf."""

from __future__ import annotations

import struct
from pathlib import Path


def read_scalar_events(folder: Path) -> list[tuple[str, int, float]]:
    """``(tag, step, value)`` of every scalar event in every event file under ``folder``, in file
    and write order: a step charted twice (by two attempts of a job) is there twice."""
    from tensorboardX.proto.event_pb2 import Event

    found: list[tuple[str, int, float]] = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event.FromString(data[offset + 12: offset + 12 + length])
            offset += 12 + length + 4
            found += [(value.tag, event.step, value.simple_value) for value in event.summary.value]
    return found


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every scalar in every event file under ``folder``."""
    found: dict[str, dict[int, float]] = {}
    for tag, step, value in read_scalar_events(folder):
        found.setdefault(tag, {})[step] = value
    return found
