"""LAS: least attained service first (GPU-seconds received so far). Needs no job lengths: new jobs
go first, long jobs sink, which approximates SRSF when lengths are unknown."""

from __future__ import annotations

from hpcsched.allocator import Group, JobView, Snapshot
from hpcsched.policies import register
from hpcsched.policies.ordering import ordered_by, solo_groups


def _key(v: JobView) -> float:
    return v.attained_gpu_s


@register("las", hints=ordered_by(_key))
def las(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, _key)
