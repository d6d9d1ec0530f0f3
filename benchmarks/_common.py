"""Helpers shared by the benchmark scripts: memory readings, subprocess runs and plain-text tables.

Memory is read from ``/proc/self/status`` (Linux): ``VmRSS`` is the resident set now and
``VmHWM`` its high-water mark. ``VmHWM`` belongs to the process's current address space, so a
child started with ``exec`` begins at zero, whatever its parent holds. ``ru_maxrss`` is not
used as the main figure because Linux carries the pre-``exec`` address space's peak into it,
so a child of a large parent would report the parent's size. Writing ``5`` to
``/proc/self/clear_refs`` resets ``VmHWM`` to the current ``VmRSS``, which lets a script
measure the peak of one operation. Elsewhere the helpers fall back to ``ru_maxrss``.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_mb(key: str) -> float | None:
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    match = re.search(rf"^{key}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


def ru_maxrss_mb() -> float:
    """``getrusage(RUSAGE_SELF).ru_maxrss`` in MiB (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float:
    """Resident set size now, in MiB (``VmRSS``); ``ru_maxrss`` where /proc is missing."""
    value = _status_mb("VmRSS")
    return value if value is not None else ru_maxrss_mb()


def peak_rss_mb() -> float:
    """Peak resident set size of this process's address space, in MiB (``VmHWM``)."""
    value = _status_mb("VmHWM")
    return value if value is not None else ru_maxrss_mb()


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS; False when the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class ForeignCpu:
    """CPU time used by *other* processes, to tell a slow step from a step that lost its cores.

    ``/proc/stat`` gives the machine's busy time (user, nice, system, irq, softirq, steal) and
    ``os.times()`` this process's own user + system time; the difference of their deltas over an
    interval is what everything else (and the hypervisor, as steal) took. Tick resolution
    (``SC_CLK_TCK``, usually 10 ms), so it only separates quiet intervals from busy ones.
    With ``children=True`` the CPU time of this process's finished (waited-for) children counts as
    its own too, for a parent that measures the load around a child it runs.
    """

    def __init__(self, children: bool = False) -> None:
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self.children = children
        self.start = self._now()

    def _now(self) -> tuple[float, float]:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return math.nan, 0.0
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        times = os.times()
        own = times.user + times.system
        if self.children:
            own += times.children_user + times.children_system
        return (user + nice + system + irq + softirq + steal) * self.tick, own

    def restart(self) -> None:
        self.start = self._now()

    def seconds(self) -> float:
        """CPU seconds other processes used since the last :meth:`restart`, machine-wide."""
        busy, own = self._now()
        return max(0.0, (busy - self.start[0]) - (own - self.start[1]))


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def child_env(threads: int) -> dict[str, str]:
    """Environment for a measured child: fixed thread counts, no network, no tokenizer threads."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env.update(
        {
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run_child(
    script: Path, args: list[str], threads: int, log_path: Path, timeout_s: float
) -> dict[str, Any]:
    """Run ``python script args --result-file F`` in a fresh interpreter and return the JSON in ``F``.

    The child's stdout and stderr go to ``log_path``; on failure its tail is raised with the error.
    """
    with tempfile.TemporaryDirectory(prefix="bench-result-") as tmp:
        result_file = Path(tmp) / "result.json"
        command = [sys.executable, str(script), *args, "--result-file", str(result_file)]
        with log_path.open("w") as log:
            proc = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(threads),
                timeout=timeout_s,
                check=False,
            )
        if proc.returncode != 0 or not result_file.exists():
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}; log tail:\n{tail}")
        return json.loads(result_file.read_text())


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=2))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left/right aligned plain-text table (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
