"""docker-compose.yml as the tests read it: the services, and the Dockerfile its app services
build from (``build.dockerfile_inline``), split into instructions.

Shared by ``tests/api/test_compose.py`` (what the file says) and
``tests/api/test_wheel_install.py`` (that what the image copies installs and runs).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
APP_SERVICES = ("api", "scheduler", "worker")  # ours: they run the image built from this checkout


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def inline_dockerfile(services: dict[str, dict[str, Any]], name: str = "api") -> str:
    """The Dockerfile text as written in the compose file (``$$`` still doubled)."""
    return services[name]["build"]["dockerfile_inline"]


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, as Docker reads them: comment lines dropped,
    continued lines joined, and Compose's ``$$`` read as the one ``$`` Docker receives."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.replace("$$", "$").splitlines() if not line.lstrip().startswith("#")))
    parsed = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            parsed.append((keyword.upper(), arguments.strip()))
    return parsed


def copy_sources(parsed: list[tuple[str, str]]) -> list[str]:
    """What the build copies from the checkout (every COPY's sources, its destination dropped)."""
    return [source for keyword, arguments in parsed if keyword == "COPY"
            for source in arguments.split()[:-1] if not source.startswith("--")]
