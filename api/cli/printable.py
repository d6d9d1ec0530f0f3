"""Server strings made safe for a terminal.

A job's name, an error message or a team's label comes from whoever submitted it; printed raw,
an ESC sequence in it could clear the screen, retitle the window or hide text from an admin
running ``grpo list``. Every control character except newline and tab (which our own layout
uses) is shown as a visible ``\\xNN`` escape instead, so nothing is lost and nothing is obeyed.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and the C1 range (which some terminals also obey).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
