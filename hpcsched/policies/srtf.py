"""SRTF: shortest remaining (solo) time first, preemptive. Needs job lengths (clairvoyant); minimises
average JCT on one machine, but ignores that a 32-GPU job blocks 32x the capacity of a 1-GPU job."""

from __future__ import annotations

from hpcsched.allocator import Group, Snapshot
from hpcsched.policies import register
from hpcsched.policies.ordering import ordered_by, remaining_s, solo_groups


@register("srtf", hints=ordered_by(remaining_s))
def srtf(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, remaining_s)
