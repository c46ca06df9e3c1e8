"""Placement: on which workers a unit's slots go (Blox's placement plug-ins).

The contract every placement step keeps (checked over the whole registry by tests/test_plugins.py):

- it is a pure function of a ``PlacementView`` (no state, no clock, no I/O), so the simulator and the
  runtime's controller place alike from the same state;
- it returns ``[(worker index, slots)]`` with every index a candidate worker's, each count > 0 and at most
  that worker's free slots, each worker at most once, the counts summing to ``need``; or None when it
  will not place the unit now (the unit waits, with the reason, and nothing else changes);
- a step that reads CPUs and memory (``resource-aware``) gives no worker that states them (not None) more
  slots than they can feed (``PlacementView.usable``); the others place by slots alone, as Blox's do;
- it returns None when the candidates' free slots total less than ``need``.

The order of the returned pairs is the order of the unit's node ranks. A new step is one module of this
package that decorates its function with ``register(name)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcsched.plugins import PluginRegistry


@dataclass(frozen=True, slots=True)
class PlacementView:
    """A unit to place (``need`` slots) and the candidate workers (those that have its launcher and a GPU type
    it accepts), in the core's worker order: free slots, free CPUs and memory where the worker states them (None:
    not tracked), and each one's GPU type with the unit's model for steps that weigh speed by type (fields a step
    does not read keep their defaults, so views built before they existed mean the same)."""

    need: int
    free: tuple[int, ...]
    slots_per_node: int  # the largest worker's slots: consolidated placement's node size
    cpus_free: tuple[float | None, ...] = ()
    mem_free_gb: tuple[float | None, ...] = ()
    cpus_per_proc: float = 0.0
    mem_per_proc_gb: float = 0.0
    gpu_types: tuple[str, ...] = ()  # each candidate's GPU type ("" or absent: not advertised)
    model: str | None = None  # the unit's model as Gavel's throughput table names it, where the job says

    def usable(self) -> list[int]:
        """Free slots per candidate that its free CPUs and memory can also feed."""
        out = []
        for i, f in enumerate(self.free):
            k = max(0, f)
            cpus = self.cpus_free[i] if i < len(self.cpus_free) else None
            mem = self.mem_free_gb[i] if i < len(self.mem_free_gb) else None
            if cpus is not None and self.cpus_per_proc > 0:
                k = min(k, int(cpus // self.cpus_per_proc))
            if mem is not None and self.mem_per_proc_gb > 0:
                k = min(k, int(mem // self.mem_per_proc_gb))
            out.append(max(0, k))
        return out


Placement = Callable[[PlacementView], "list[tuple[int, int]] | None"]

REGISTRY: PluginRegistry[Placement] = PluginRegistry(__name__, "placement step")
register = REGISTRY.register
get_placement = REGISTRY.get

__all__ = ["REGISTRY", "Placement", "PlacementView", "get_placement", "register"]
