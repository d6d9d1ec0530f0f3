"""The program a ``python`` reward runs inside the sandbox: it loads the team's grader once and
scores every row of the call with it, one line of JSON per row.

Runs under the sandbox's interpreter with ``-I -S``: the standard library only. Its source is
sent as the sandbox's program (:mod:`grpo_core.rewards.python_grader` reads this file as text; the
service never imports it to run it) and its input comes on stdin as one JSON document::

    {"source": "<the grader's code>", "rows": [{"sample": {...}, "item": {...}}, ...]}

Output protocol, on the file descriptor that was stdout when it started (the grader's own
``print`` output is kept from it, so a chatty grader cannot corrupt the results by accident):

* ``{"load_error": "..."}`` once, when the source does not run or defines no callable ``grade``;
* else per row, in order: ``{"i": N, "value": <what grade returned>}`` when that is ``None``, a
  bool, an int or a float (as JSON: NaN and infinities as ``NaN``/``Infinity``);
  ``{"i": N, "returned": "<its type and repr>"}`` for anything else; ``{"i": N, "error": "..."}``
  when ``grade`` raised: its type, message and the grader's line (number and code).

Nothing here checks a value: this interpreter runs the team's code, which can rewrite anything in
it (this module's functions through ``sys.modules['__main__']``, builtins, ``json``, the results
descriptor itself). The caller (:func:`grpo_core.rewards.python_grader.grade_rows`, outside the
sandbox) parses every line strictly and keeps only numbers in [0, 1]; whatever reaches it from
here is untrusted text.

Each line is flushed as it is written, so rows scored before a timeout still count. Messages are
cut to :data:`MESSAGE_CHARS` so the caller can bound the output it reads by the number of rows.
"""

import io
import json
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


def _short(exc, source_lines):
    """The exception as its type and message, with the grader's line (its number and its code)
    when there is one: the line is kept whole and the message cut, so a long message cannot hide
    where it came from."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == "grader.py"]
    where = ""
    if frames:
        number = frames[-1].lineno
        code = source_lines[number - 1].strip()[:100] if 0 < number <= len(source_lines) else ""
        where = f" (grader.py line {number}: {code})" if code else f" (grader.py line {number})"
    return f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS - len(where)] + where


def _raw(result):
    """grade's return value as it is, for the caller to check: numbers and None as JSON values,
    anything else described (an object JSON cannot carry, a string the caller would not score)."""
    if result is None or isinstance(result, bool | int | float):
        return {"value": result}
    return {"returned": f"{type(result).__name__} {result!r:.60}"}


def main():
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    # The grader's prints, at the file-descriptor level too (os.write(1, ...), child processes).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    printed = _CappedText()
    sys.stdout = printed

    def emit(record):
        try:
            line = json.dumps(record)
        except (TypeError, ValueError):  # an int past Python's digit limit, a float subclass's repr
            line = json.dumps({"i": record.get("i"), "returned": "a value that does not serialise"})
        results.write(line + "\n")
        results.flush()

    payload = json.loads(sys.stdin.read())
    namespace = {"__name__": "grader"}
    source_lines = payload["source"].splitlines()
    try:
        exec(compile(payload["source"], "grader.py", "exec"), namespace)
        grade = namespace.get("grade")
        if not callable(grade):
            raise NameError("the source defines no function grade(sample, item)")
    except BaseException as exc:  # the team's code: any failure is reported, not raised
        emit({"load_error": _short(exc, source_lines), "printed": printed.text()[:MESSAGE_CHARS]})
        return
    for index, row in enumerate(payload["rows"]):
        try:
            record = _raw(grade(row["sample"], row["item"]))
        except BaseException as exc:  # SystemExit too: one row's failure, not the call's
            record = {"error": _short(exc, source_lines)}
        record["i"] = index
        emit(record)


if __name__ == "__main__":
    main()
