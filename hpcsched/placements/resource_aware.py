"""CPU- and memory-aware placement, in the manner of Synergy (OSDI'22, Blox's ``synergy`` placement): a GPU
whose node cannot also give its job the CPUs and memory each worker process needs is no use to that job, so
each worker offers only as many slots as its free CPUs and memory can feed, and the unit is then placed
consolidated over those. Where workers or jobs state no CPU or memory figures, it places as ``consolidated``."""

from __future__ import annotations

from hpcsched.placements import PlacementView, register
from hpcsched.primitives.placement import place_consolidated


@register("resource-aware")
def resource_aware(view: PlacementView) -> list[tuple[int, int]] | None:
    return place_consolidated(view.usable(), view.need, view.slots_per_node)
