"""The program a job's tool calls run in, inside the sandbox: it loads the spec's tools sources
once and makes each call of the batch, one line of JSON per call.

Runs under the sandbox's interpreter with ``-I -S`` (the standard library only); its source is
sent as the sandbox's program (:mod:`grpo_core.agents.tool_runner` reads this file as text; the
service never imports it to run it). Input on stdin, one JSON document::

    {"sources": ["<tools source>", ...], "calls": [{"name": "add", "arguments": {"a": 1}}, ...]}

Output, on the descriptor that was stdout when it started (the tools' own prints are dropped):
``{"load_error": "..."}`` once when a source does not run; else per call, in order,
``{"i": N, "result": "<str of what the tool returned>"}`` or ``{"i": N, "error": "<type: message>"}``.
Each is cut to ``MESSAGE_CHARS``; everything here is the team's to rewrite, so the caller parses
it as untrusted text.
"""

import json
import os
import sys

MESSAGE_CHARS = 4000


def main():
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")

    def emit(record):
        try:
            line = json.dumps(record)
        except (TypeError, ValueError):
            line = json.dumps({"i": record.get("i"), "error": "the tool's result does not serialise"})
        results.write(line + "\n")
        results.flush()

    payload = json.loads(sys.stdin.read())
    tools = {}
    for index, source in enumerate(payload["sources"]):
        namespace = {"__name__": "tools"}
        try:
            exec(compile(source, f"tools_{index}.py", "exec"), namespace)
        except BaseException as exc:  # the team's code: reported, not raised
            emit({"load_error": f"tools.{index}: {type(exc).__name__}: {exc}"[:MESSAGE_CHARS]})
            return
        tools.update(
            {
                name: value
                for name, value in namespace.items()
                if type(value).__name__ == "function"
                and not name.startswith("_")
                and getattr(value, "__module__", "") == "tools"
            }
        )
    for index, call in enumerate(payload["calls"]):
        try:
            function = tools.get(call["name"])
            if function is None:
                raise ValueError(f"Tool {call['name']} not found.")
            record = {"result": str(function(**call["arguments"]))[:MESSAGE_CHARS]}
        except BaseException as exc:  # one call's failure, not the batch's
            record = {"error": str(exc)[:MESSAGE_CHARS], "kind": type(exc).__name__}
        record["i"] = index
        emit(record)


if __name__ == "__main__":
    main()
