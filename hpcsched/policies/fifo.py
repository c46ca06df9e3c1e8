"""FIFO: first come, first served, with backfilling (a later job that fits runs when an earlier one
cannot). Running jobs are never preempted by later arrivals because they arrived earlier."""

from __future__ import annotations

from hpcsched.allocator import Group, Snapshot
from hpcsched.policies._order import runs_every_job, solo_groups


@runs_every_job
def fifo(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, lambda v: v.submit)
