"""How to install an optional library the core needs: the extra of the distribution that
installed this core, found in the installed metadata rather than written here, so the core names
no distribution of its own; without such metadata (a source checkout), the library itself."""

from __future__ import annotations

from importlib import metadata


def install_hint(extra: str, library: str) -> str:
    """``pip install '<distribution>[extra]'``, or ``pip install library`` when no installed
    distribution holds this package."""
    distributions = metadata.packages_distributions().get(__package__ or "grpo_core", [])
    if distributions:
        return f"pip install '{distributions[0]}[{extra}]'"
    return f"pip install {library}"
