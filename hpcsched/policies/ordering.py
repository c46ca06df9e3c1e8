"""Shared helpers of the policies that order single jobs by a priority key (every baseline).

Baseline policies differ only in their sort key; ties always fall back to arrival order (the
snapshot lists jobs in arrival order and ``sorted`` is stable), as in the reference simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from hpcsched.allocator import Group, JobView, PolicyHints, Snapshot


def ordered_by(key: Callable[[JobView], Any], **more: Any) -> PolicyHints:
    """The hints of a policy whose answer is exactly ``solo_groups(snapshot, key)`` and whose key of a
    WAITING job depends only on that job's own view (not on the clock or the other jobs): the simulator
    may then keep waiting jobs sorted between events instead of calling the policy (same answer, without
    an O(active jobs) sort at every event on deep queues)."""
    return PolicyHints(runs_every_job=True, order_key=key, **more)


@lru_cache(maxsize=1 << 16)
def solo(job_id: str) -> Group:
    """The single-job group of ``job_id``. Memoised: Group is immutable, and building thousands of
    them at every event was the simulator's largest cost on deep queues."""
    return Group((job_id,))


def solo_groups(snapshot: Snapshot, key: Callable[[JobView], Any]) -> list[Group]:
    """Every active job as its own group, lowest ``key`` first."""
    return [solo(v.id) for v in sorted(snapshot.jobs, key=key)]


def remaining_s(v: JobView) -> float:
    """Solo seconds left; a trace without lengths counts as infinitely long (runs last)."""
    return v.remaining_s if v.remaining_s is not None else float("inf")
