"""Consolidated placement (the default; Muri's, Tiresias' and Blox's ``consolidated``): as few workers as
possible, first fit (``hpcsched.primitives.placement.place_consolidated``), so gradient traffic stays on one node.
It does not look at CPUs or memory: that is what ``resource-aware`` adds."""

from __future__ import annotations

from hpcsched.placements import PlacementView, register
from hpcsched.primitives.placement import place_consolidated


@register("consolidated")
def consolidated(view: PlacementView) -> list[tuple[int, int]] | None:
    return place_consolidated([max(0, f) for f in view.free], view.need, view.slots_per_node)
