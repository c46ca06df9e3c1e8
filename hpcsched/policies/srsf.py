"""SRSF: shortest remaining service first, service = remaining solo time x GPUs. Unlike SRTF it
charges wide jobs for the capacity they hold, which is what lowers average JCT on a shared cluster."""

from __future__ import annotations

from hpcsched.allocator import Group, JobView, Snapshot
from hpcsched.policies import register
from hpcsched.policies.ordering import ordered_by, remaining_s, solo_groups


def _key(v: JobView) -> float:
    return remaining_s(v) * v.gpus


@register("srsf", hints=ordered_by(_key))
def srsf(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, _key)
