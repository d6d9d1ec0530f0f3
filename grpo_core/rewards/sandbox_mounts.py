"""What of the host's files the code sandbox (:mod:`grpo_core.rewards.sandbox`) shows: only what its
interpreter needs to run, read-only. That is the interpreter binary, its standard library (asked of
the interpreter itself: ``sysconfig``'s stdlib and platstdlib, and ``lib-dynload``), the shared
libraries that the interpreter and its ``lib-dynload`` extension modules link (from ``ldd``, run on
those trusted system files), the dynamic loader, and the loader's cache (``/etc/ld.so.cache``: it
only maps library names to paths, and without it an interpreter linked against a library outside
the loader's default folders would not start). Not the rest of ``/usr``: no compilers, shells or
other programs to run, no other libraries to load, no host data to read.

The top-level links of a merged-/usr system (``/lib``, ``/lib64``) are kept as links, since the
loader's own path and its default search folders go through them; ``/bin`` and ``/sbin`` are not,
nothing needs them. Found once per process (the files do not change while a worker runs).
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

__all__ = ["MountsUnavailable", "interpreter_mounts", "ldd_paths"]

_LOADER_CACHE = "/etc/ld.so.cache"
_LIBRARY_LINKS = ("/lib", "/lib32", "/lib64", "/libx32")
# Run by the interpreter itself: where its standard library and its extension modules are.
_ASK_PATHS = (
    "import json, sys, sysconfig\n"
    "paths = [sysconfig.get_path('stdlib'), sysconfig.get_path('platstdlib'),"
    " sysconfig.get_config_var('DESTSHARED') or '']\n"
    "print(json.dumps(paths + [p for p in sys.path if p.endswith('lib-dynload')]))\n"
)
# A clean environment for the helpers, so that no LD_LIBRARY_PATH of the worker's decides which
# libraries ldd names (inside, the loader runs with an empty environment).
_CLEAN_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


class MountsUnavailable(RuntimeError):
    """The interpreter's files could not be found (it failed to answer, or ldd is missing)."""


def ldd_paths(ldd_output: str) -> list[str]:
    """The absolute library paths in ``ldd``'s output (resolved libraries and the loader); its
    per-file headers (``/path:``), the vDSO and unresolved names carry none."""
    found = []
    for line in ldd_output.splitlines():
        if not line.startswith(("\t", " ")):
            continue  # the "file:" header of each input
        words = line.split()
        target = words[words.index("=>") + 1] if "=>" in words[:-1] else words[0] if words else ""
        if target.startswith("/"):
            found.append(target)
    return found


def _library_dirs(interpreter: str) -> list[str]:
    try:
        answer = subprocess.run([interpreter, "-I", "-S", "-c", _ASK_PATHS], capture_output=True,
                                text=True, timeout=30, check=True, env=_CLEAN_ENV)
        paths = json.loads(answer.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise MountsUnavailable(f"{interpreter} did not say where its standard library is: {exc}") from exc
    return sorted({os.path.realpath(path) for path in paths if path and os.path.isdir(path)})


def _linked_libraries(files: list[str]) -> list[str]:
    try:
        answer = subprocess.run(["ldd", *files], capture_output=True, text=True, timeout=60, env=_CLEAN_ENV)
    except (OSError, subprocess.SubprocessError) as exc:
        raise MountsUnavailable(f"ldd could not list the interpreter's libraries: {exc}") from exc
    libraries = ldd_paths(answer.stdout)
    if not libraries:
        raise MountsUnavailable(f"ldd named no library for {files[0]}: {answer.stderr.strip()[-200:]}")
    return libraries


def _inside_path(path: str) -> str:
    """Where a library appears inside: its folder resolved (so no bind goes through a top-level
    link), its own name kept (the loader opens the name, which may be a link to a versioned file)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


@lru_cache(maxsize=4)
def interpreter_mounts(interpreter: str) -> tuple[str, ...]:
    """bwrap's arguments that show ``interpreter`` and what it needs, read-only, and nothing else."""
    directories = _library_dirs(interpreter)
    extensions = sorted(str(path) for folder in directories if folder.endswith("lib-dynload")
                        for path in Path(folder).glob("*.so"))
    linked = _linked_libraries([interpreter, *extensions])
    libraries = sorted({_inside_path(path): path for path in linked}.items())
    args = ["--ro-bind", interpreter, interpreter]
    # lib-dynload usually lies in the stdlib folder: one bind of the outer folder shows both.
    for folder in (folder for folder in directories
                   if not any(folder.startswith(other + "/") for other in directories)):
        args += ["--ro-bind", folder, folder]
    for inside, host in libraries:
        args += ["--ro-bind", host, inside]
    if os.path.isfile(_LOADER_CACHE):
        args += ["--ro-bind", _LOADER_CACHE, _LOADER_CACHE]
    for name in _LIBRARY_LINKS:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
    return tuple(args)
