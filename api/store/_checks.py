"""Value checks shared by the team and pool stores. The HTTP schemas (``api.schemas.admin``)
declare the same limits from the same ``api.vocabulary`` constants, but the CLI reaches the store
without them, so the store checks too."""

from __future__ import annotations

import math
import re

from api.domain.errors import InvalidInput
from api.vocabulary import MAX_ARTIFACT_QUOTA_BYTES, MAX_LABEL_LENGTH, MAX_QUOTA_GPUS, NAME_PATTERN

_NAME = re.compile(NAME_PATTERN)


def check_name(name: str, param: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"{param} '{name}' must match {NAME_PATTERN} (lower case, digits, '_' and '-')",
                           param=param)
    return name


def check_weight(weight: float) -> float:
    if not (math.isfinite(weight) and weight > 0):
        raise InvalidInput(f"weight must be a finite number > 0, not {weight}", param="weight")
    return float(weight)


def check_gpus(gpus: int, param: str = "gpus") -> int:
    if not 0 <= gpus <= MAX_QUOTA_GPUS:
        raise InvalidInput(f"{param}: a quota must be 0..{MAX_QUOTA_GPUS} GPUs, not {gpus}", param=param)
    return gpus


def check_bytes(count: int, param: str = "bytes") -> int:
    if not 0 <= count <= MAX_ARTIFACT_QUOTA_BYTES:
        raise InvalidInput(f"{param}: a byte quota must be 0..{MAX_ARTIFACT_QUOTA_BYTES}, not {count}",
                           param=param)
    return count


def check_label(label: str | None) -> str | None:
    if label is not None and len(label) > MAX_LABEL_LENGTH:
        raise InvalidInput(f"label is longer than {MAX_LABEL_LENGTH} characters", param="label")
    return label
