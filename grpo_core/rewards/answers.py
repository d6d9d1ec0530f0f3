"""Reading the number an answer commits to, for ``numeric_match``.

Kept apart from the reward definitions: it is the one piece with real parsing rules, and it is
tested on its own.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

__all__ = ["parse_number", "reference_number"]

# --- numbers -------------------------------------------------------------------------------------
# Prose: the last number wins and only commas group thousands. In an answer slot (a \boxed{} or the
# reference) spaces may group thousands too and a/b is a fraction; in prose "3 100 bills" or
# "1/2 of them" are too often not one number.
_INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
_INT_SLOT = r"(?:\d{1,3}(?:[, \u00a0\u202f\u2009]\d{3})+(?!\d)|\d+)"
_HEAD = r"(?<![\w.])(?P<sign>[-+]?)(?:\$\s?)?"  # a sign must touch the number: "5 - 3" ends in 3
_TAIL = r"(?:\.\d+)?(?:[eE][-+]?\d+)?"  # decimals, then an optional exponent (1.5e3)
_PROSE = re.compile(_HEAD + r"(?P<num>(?:" + _INT + r"|(?=\.\d))" + _TAIL + ")")
_SLOT = re.compile(
    _HEAD + r"(?P<num>(?:" + _INT_SLOT + r"|(?=\.\d))" + _TAIL + ")"
    r"(?:\s*/\s*(?P<den>" + _INT_SLOT + _TAIL + "))?"
)
_BOXED = re.compile(r"\\boxed\s*\{")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mathbf|mbox)\s*\{([^{}]*)\}")
_LATEX_PLAIN = {"\\$": "$", "\\%": "%", "{,}": ",", "\\,": "", "\\!": "", "\\;": "", "\u2212": "-"}


def _boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}``; braces inside may nest (``\\frac{3}{4}``).

    An earlier box can only be the last closed one if it closes before the next box starts, so
    each scan stops there: linear time even for a completion full of unclosed boxes.
    """
    limit = len(text)
    for match in reversed(list(_BOXED.finditer(text))):
        depth = 1
        for end in range(match.end(), limit):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                return text[match.end() : end]
        limit = match.start()
    return None


def _last_number(text: str, slot: bool) -> float | None:
    for old, new in _LATEX_PLAIN.items():
        text = text.replace(old, new)
    text = _LATEX_FRAC.sub(r" \1/\2", _LATEX_TEXT.sub(r" \1", text))
    matches = list((_SLOT if slot else _PROSE).finditer(text))
    if not matches:
        return None
    last = matches[-1]
    value = float(re.sub(r"[,\s]", "", last["num"]))
    if slot and last["den"]:
        denominator = float(re.sub(r"[,\s]", "", last["den"]))
        value = value / denominator if denominator else math.nan
    value = -value if last["sign"] == "-" else value
    return value if math.isfinite(value) else None


def parse_number(text: str) -> float | None:
    """The number a completion commits to: in its last ``\\boxed{}``, else its last number."""
    boxed = _boxed(text)
    return _last_number(boxed, slot=True) if boxed is not None else _last_number(text, slot=False)


def reference_number(value: Any) -> float | None:
    """A reference answer: after the last ``####`` (GSM8K) when present, read as an answer slot."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if abs(value) <= sys.float_info.max else None  # False for NaN, inf and 10**400
    text = str(value).rsplit("####", 1)[-1]
    boxed = _boxed(text)
    return _last_number(boxed if boxed is not None else text, slot=True)
