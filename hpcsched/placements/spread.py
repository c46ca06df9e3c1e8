"""Spread placement: a unit's slots one at a time on the worker with the most free slots left (ties: the
first in worker order), so jobs spread over as many workers as they can. It evens the load on CPUs, memory
bandwidth and disks per node at the price of cross-node traffic: what Blox offers beside consolidation for
jobs that are bound by their input pipeline rather than by gradient exchange."""

from __future__ import annotations

from hpcsched.placements import PlacementView, register


@register("spread")
def spread(view: PlacementView) -> list[tuple[int, int]] | None:
    left = view.usable()
    if sum(left) < view.need:
        return None
    got: dict[int, int] = {}
    for _ in range(view.need):
        i = max(range(len(left)), key=lambda k: (left[k], -k))
        left[i] -= 1
        got[i] = got.get(i, 0) + 1
    return sorted(got.items())
