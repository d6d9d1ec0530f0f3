"""The program a batch of an environment's episodes runs in, inside the sandbox: it loads the
team's source once, then forks one process per episode, which makes that episode's own
``Environment`` and answers its calls for the whole episode. Each episode's state lives in its
own process (nothing of one is another's: forked, the processes share no memory), and the
episodes' calls run at the same time. This process only carries lines between the host and the
episodes.

Runs under the sandbox's interpreter with ``-I -S`` (the standard library only); its source is
sent as the sandbox's program (:mod:`grpo_core.agents.environment_runner` reads this file as
text; the service never imports it to run it). Lines of JSON both ways::

    {"source": "<the environment's source>", "episodes": N}  -> {"ready": true} | {"load_error": "..."}
    {"e": I, "op": "reset", "item": {<the dataset row>}}    -> {"e": I, "observation": <what reset returned>}
    {"e": I, "op": "step", "action": "<the model's turn>"}  -> {"e": I, "result": <what step returned>}
    {"e": I, "op": "end"}                                   (no answer: episode I's process is ended)

A call that raised answers ``{"e": I, "error": "<type: message>"}``; an episode whose process
ended answers ``{"e": I, "ended": true}``. Answers go to the descriptor that was stdout
when it started (the environment's own prints are dropped) in the order they come. Nothing here
is checked: the team's code can rewrite this module, so the host parses every answer as untrusted
text and knows which answers it waits for.
"""

import json
import os
import selectors
import signal
import sys

MESSAGE_CHARS = 4000
LINE_BYTES = 1 << 20  # the most of one line read from an episode (the host caps what it takes)


class _Lines:
    """Whole lines from a descriptor read as it becomes readable (a buffered file would take
    several lines at once and leave them where the selector cannot see them)."""

    def __init__(self, fd):
        self.fd, self.pending, self.closed = fd, b"", False

    def fileno(self):
        return self.fd

    def read(self):
        """The lines completed by what is there now ([] and ``closed`` at the end)."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.closed = True
            return []
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        if len(self.pending) > LINE_BYTES:  # no line that long is taken: what follows is its rest
            self.pending = b""
            lines.append(b"")
        return lines


def _quiet():
    """Point descriptors 1 and 2 (and sys.stdout, sys.stderr) at /dev/null: what the team's code
    prints goes nowhere. Returns the answers' stream (what was stdout)."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    return answers


def _line(record):
    try:
        return json.dumps(record) + "\n"
    except (TypeError, ValueError):
        return (
            json.dumps({"e": record.get("e"), "error": "the environment's answer does not serialise as JSON"})
            + "\n"
        )


def _episode(make, requests, answers):
    """One episode's process: its Environment, made at its reset, answers each request."""
    environment = None
    for raw in requests:
        request = json.loads(raw)
        try:
            if request["op"] == "reset":
                environment = make()
                record = {"observation": environment.reset(request["item"])}
            else:
                record = {"result": environment.step(request["action"])}
        except BaseException as exc:  # the team's code: reported to the host
            record = {"error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]}
        answers.write(_line(record))
        answers.flush()


def _fork_episodes(make, count, answers):
    """``count`` episode processes; for each, the pipe its requests go down and the file its
    answers come up."""
    episodes = {}
    for index in range(count):
        request_read, request_write = os.pipe()
        answer_read, answer_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(request_write)
                os.close(answer_read)
                for _, other_write, other_answers in episodes.values():
                    os.close(other_write)
                    os.close(other_answers.fd)
                answers.close()
                os.close(0)
                _episode(
                    make,
                    os.fdopen(request_read, "r", encoding="utf-8"),
                    os.fdopen(answer_write, "w", encoding="utf-8"),
                )
            finally:
                os._exit(0)
        os.close(request_read)
        os.close(answer_write)
        episodes[index] = (pid, request_write, _Lines(answer_read))
    return episodes


def _end(episodes, index):
    pid, request_write, episode_answers = episodes.pop(index)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    os.close(request_write)
    os.close(episode_answers.fd)


def main():
    answers = _quiet()
    namespace = {"__name__": "environment"}
    try:
        first = json.loads(sys.stdin.buffer.raw.readline())
        exec(compile(first["source"], "environment.py", "exec"), namespace)
        make = namespace["Environment"]
        count = int(first["episodes"])
    except BaseException as exc:  # the team's code: reported, not raised
        answers.write(_line({"load_error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]}))
        answers.flush()
        return
    episodes = _fork_episodes(make, count, answers)
    answers.write(_line({"ready": True}))
    answers.flush()
    selector = selectors.DefaultSelector()
    selector.register(_Lines(0), selectors.EVENT_READ, None)
    for index, (_, _, episode_answers) in episodes.items():
        selector.register(episode_answers, selectors.EVENT_READ, index)
    while episodes:
        for key, _ in selector.select():
            lines = key.fileobj.read()
            if key.data is None:  # the host
                if key.fileobj.closed:
                    for index in list(episodes):
                        _end(episodes, index)
                    return
                for raw in lines:
                    _forward(json.loads(raw), raw, episodes, selector)
                continue
            index = key.data
            records = []
            for raw in lines:
                try:
                    records.append(json.loads(raw))
                except ValueError:
                    records.append({"error": "the episode answered something that is not JSON"})
            if key.fileobj.closed and index in episodes:
                selector.unregister(key.fileobj)
                _end(episodes, index)
                records.append({"ended": True})
            for record in records:
                if not isinstance(record, dict):
                    record = {"error": "the episode's answer is no object"}
                record["e"] = index
                answers.write(_line(record))
            answers.flush()


def _forward(request, raw, episodes, selector):
    """A host's request to its episode: ended (``end``), or passed on."""
    index = request.get("e")
    if index not in episodes:
        return
    if request.get("op") == "end":
        selector.unregister(episodes[index][2])
        _end(episodes, index)
        return
    os.write(episodes[index][1], raw + b"\n")


if __name__ == "__main__":
    main()
