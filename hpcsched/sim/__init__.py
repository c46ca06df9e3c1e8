"""Event-driven DL-cluster simulator: ``simulate()``, consolidated placement, the CLI.

Kept light on purpose: importing ``hpcsched.sim`` loads nothing heavy; ``simulate`` and
``place_consolidated`` are imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate", "SimResult", "place_consolidated"]


def __getattr__(name: str) -> Any:
    if name in ("simulate", "SimResult"):
        from hpcsched.sim import engine

        return getattr(engine, name)
    if name == "place_consolidated":
        from hpcsched.primitives.placement import place_consolidated

        return place_consolidated
    raise AttributeError(name)
