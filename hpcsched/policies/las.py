"""LAS: least attained service first (GPU-seconds received so far). Needs no job lengths: new jobs
go first, long jobs sink, which approximates SRSF when lengths are unknown."""

from __future__ import annotations

from hpcsched.allocator import Group, Snapshot
from hpcsched.policies._order import runs_every_job, solo_groups


@runs_every_job
def las(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, lambda v: v.attained_gpu_s)
