"""SRSF: shortest remaining service first, service = remaining solo time x GPUs. Unlike SRTF it
charges wide jobs for the capacity they hold, which is what lowers average JCT on a shared cluster."""

from __future__ import annotations

from hpcsched.allocator import Group, Snapshot
from hpcsched.policies._order import remaining_s, runs_every_job, solo_groups


@runs_every_job
def srsf(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, lambda v: remaining_s(v) * v.gpus)
