"""Tiresias: discretised two-dimensional LAS (Gu et al., NSDI'19), as configured in Muri's evaluation.

A job's queue is the number of limits its attained GPU-seconds has reached (limits 3250 and 7200
GPU-s: three queues; the reference also lists 18000, which its code never reaches). Lower queues go
first; inside a queue, running jobs stay ahead of waiting ones (no preemption within a queue) and
then first come, first served. Discretising keeps a job from being preempted every time another
job's attained service overtakes it, which is what plain LAS suffers from.

Its ``service_thresholds`` hint tells the simulator to wake up when a running job crosses a limit, so
demotion happens on time and not at the next arrival or completion.
"""

from __future__ import annotations

from bisect import bisect_right

from hpcsched.allocator import Group, JobView, Snapshot
from hpcsched.compat.muri import TIRESIAS_LOOP
from hpcsched.policies import register
from hpcsched.policies.ordering import ordered_by, solo_groups

QUEUE_LIMITS_GPU_S: tuple[float, ...] = (3250.0, 7200.0)


def queue_of(v: JobView, limits: tuple[float, ...] = QUEUE_LIMITS_GPU_S) -> int:
    """0 for the highest-priority queue; demoted once per limit reached (>=)."""
    return bisect_right(limits, v.attained_gpu_s)


def _key(v: JobView) -> tuple[int, bool, float]:
    return (queue_of(v), not v.running, v.submit)


# compat_rank_order: in compat mode its answer is sorted by rank_hint, so the simulator keeps the reference's
# (queue, seq) lists itself instead of calling it
@register("tiresias", hints=ordered_by(_key, service_thresholds=QUEUE_LIMITS_GPU_S, compat_rank_order=True,
                                        compat={"muri": TIRESIAS_LOOP}))
def tiresias(snapshot: Snapshot) -> list[Group]:
    if snapshot.compat == "muri" and all(v.rank_hint is not None for v in snapshot.jobs):
        # the reference's lists: queue-major, running first after each event, else history order
        return solo_groups(snapshot, lambda v: v.rank_hint)
    return solo_groups(snapshot, _key)
