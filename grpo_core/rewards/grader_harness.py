"""The program a ``python`` reward runs inside the sandbox: it loads the team's grader once and
scores every row of the call with it, one line of JSON per row.

Runs under the sandbox's interpreter with ``-I -S``: the standard library only. Its source is
sent as the sandbox's program (:mod:`grpo_core.rewards.python_grader` reads this file as text; the
service never imports it to run it) and its input comes on stdin as one JSON document::

    {"source": "<the grader's code>", "rows": [{"sample": {...}, "item": {...}}, ...]}

Output protocol, on the file descriptor that was stdout when it started (the grader's own
``print`` output is kept from it, so a chatty grader cannot corrupt the results):

* ``{"load_error": "..."}`` once, when the source does not run or defines no callable ``grade``;
* else per row, in order: ``{"i": N, "value": <number or null>}``, or
  ``{"i": N, "error": "..."}`` when ``grade`` raised or returned something that is not a number.

Each line is flushed as it is written, so rows scored before a timeout still count. Messages are
cut to :data:`MESSAGE_CHARS` so the caller can bound the output it reads by the number of rows.
"""

import io
import json
import math
import os
import sys
import traceback

MESSAGE_CHARS = 300
PRINTED_CHARS = 4096  # what is kept of the grader's own printing (shown with a load error)


class _CappedText(io.TextIOBase):
    """Where the grader's print() goes: keeps the first PRINTED_CHARS, drops the rest."""

    def __init__(self):
        self.kept = []
        self.size = 0

    def writable(self):
        return True

    def write(self, text):
        room = PRINTED_CHARS - self.size
        if room > 0:
            self.kept.append(text[:room])
            self.size += min(room, len(text))
        return len(text)

    def text(self):
        return "".join(self.kept)


def _short(exc):
    """The exception as its type and message, with the grader's line when there is one."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == "grader.py"]
    where = f" (grader.py line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"[:MESSAGE_CHARS]


def _value(result):
    if result is None:
        return {"value": None}
    if isinstance(result, bool) or not isinstance(result, int | float):
        return {"error": f"grade returned {type(result).__name__} {result!r:.60}, not a number"}
    number = float(result)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        return {"error": f"grade returned {number!r}, outside [0, 1]"}
    return {"value": number}


def main():
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    # The grader's prints, at the file-descriptor level too (os.write(1, ...), child processes).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    printed = _CappedText()
    sys.stdout = printed

    def emit(record):
        results.write(json.dumps(record) + "\n")
        results.flush()

    payload = json.loads(sys.stdin.read())
    namespace = {"__name__": "grader"}
    try:
        exec(compile(payload["source"], "grader.py", "exec"), namespace)
        grade = namespace.get("grade")
        if not callable(grade):
            raise NameError("the source defines no function grade(sample, item)")
    except BaseException as exc:  # the team's code: any failure is reported, not raised
        emit({"load_error": _short(exc), "printed": printed.text()[:MESSAGE_CHARS]})
        return
    for index, row in enumerate(payload["rows"]):
        try:
            record = _value(grade(row["sample"], row["item"]))
        except BaseException as exc:  # SystemExit too: one row's failure, not the call's
            record = {"error": _short(exc)}
        record["i"] = index
        emit(record)


if __name__ == "__main__":
    main()
