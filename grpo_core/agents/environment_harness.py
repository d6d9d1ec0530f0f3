"""The program an environment's episode runs in, inside the sandbox: it loads the team's source,
makes one ``Environment`` and answers the host's requests to it, one line of JSON each, for the
whole episode (its state lives here between turns).

Runs under the sandbox's interpreter with ``-I -S`` (the standard library only); its source is
sent as the sandbox's program (:mod:`grpo_core.agents.environment_runner` reads this file as
text; the service never imports it to run it). Requests on stdin, one JSON object a line::

    {"source": "<the environment's source>"}      -> {"ready": true} | {"load_error": "..."}
    {"op": "reset", "item": {<the dataset row>}}  -> {"observation": <what reset returned>}
    {"op": "step", "action": "<the model's turn>"} -> {"result": <what step returned>}

A call that raised answers ``{"error": "<type: message>"}``. Answers go to the descriptor that was
stdout when it started (the environment's own prints are dropped). Nothing here is checked: the
team's code can rewrite this module, so the host parses every answer as untrusted text.
"""

import json
import os
import sys

MESSAGE_CHARS = 4000


def main():
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")

    def answer(record):
        try:
            line = json.dumps(record)
        except (TypeError, ValueError):
            line = json.dumps({"error": "the environment's answer does not serialise as JSON"})
        answers.write(line + "\n")
        answers.flush()

    requests = iter(sys.stdin.readline, "")
    namespace = {"__name__": "environment"}
    try:
        exec(compile(json.loads(next(requests))["source"], "environment.py", "exec"), namespace)
        environment = namespace["Environment"]()
    except BaseException as exc:  # the team's code: reported, not raised
        answer({"load_error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]})
        return
    answer({"ready": True})
    for line in requests:
        request = json.loads(line)
        try:
            if request["op"] == "reset":
                answer({"observation": environment.reset(request["item"])})
            else:
                answer({"result": environment.step(request["action"])})
        except BaseException as exc:  # one call's failure, reported to the host
            answer({"error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]})


if __name__ == "__main__":
    main()
