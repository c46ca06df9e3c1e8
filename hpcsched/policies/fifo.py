"""FIFO: first come, first served, with backfilling (a later job that fits runs when an earlier one
cannot). Running jobs are never preempted by later arrivals because they arrived earlier."""

from __future__ import annotations

from hpcsched.allocator import Group, JobView, Snapshot
from hpcsched.policies import register
from hpcsched.policies.ordering import ordered_by, solo_groups


def _key(v: JobView) -> float:
    return v.submit


@register("fifo", hints=ordered_by(_key, order_key_static=True))
def fifo(snapshot: Snapshot) -> list[Group]:
    return solo_groups(snapshot, _key)
