"""``decide`` in its ``regroup="replan"`` mode: the re-planning rule (``hpcsched.core.replan``, the simulator's
default mode) over the core's records, answered as a ``Plan`` that an executor whose stops take time can apply.

The rule is the simulator's, run by the same code: the policy's groups are chosen in priority order on an
empty cluster, chosen running groups stay where their slots are, the rest are placed first fit. A job the
policy leaves out does not run (unlike the controller's default rule, which appends it). What the answer
means for an executor whose stops are not instantaneous (the controller):

- a running job the plan keeps on its slots keeps running at its size;
- a running job left out, or put on other slots or into another group, is stopped (reason "preempt": it
  checkpoints and goes back to the queue); a later decision places it again once it has stopped;
- a pending job starts now only if the slots the plan gives it are free now (not held by running or stopping
  jobs); otherwise it waits for the stops this plan makes, and the next decision starts it.

Sizes are the jobs' minimum (running: their current size): re-planning does not size elastic jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpcsched.allocator import Group
from hpcsched.compat.muri import CompatRules
from hpcsched.core.replan import Planned, Planner
from hpcsched.primitives.placement import first_slots
from hpcsched.primitives.state import ClusterState, Plan, WorkerState


@dataclass(eq=False, slots=True)
class _Member:
    """A job as re-planning reads it (``replan.Member``)."""

    id: str
    gpus: int
    running: bool
    place: Any
    group: tuple[str, ...]


class _Cluster(Planner):
    """The state re-planning reads, built from one ``ClusterState``."""

    def __init__(self, state: ClusterState, workers: Sequence[WorkerState], name: str) -> None:
        self.name = name
        self.capacity = [w.slots for w in workers]
        self.total = sum(self.capacity)
        self.gpn = max(self.capacity, default=1) or 1
        self.nps = None
        self.compat = False
        self.rules = CompatRules()
        index = {w.id: i for i, w in enumerate(workers)}
        keys: dict[str, list[str]] = {}
        for j in state.jobs:
            if j.running:
                keys.setdefault(j.group or j.id, []).append(j.id)
        places: dict[str, tuple[tuple[int, int], ...]] = {}
        self.by_id: dict[str, Any] = {}
        self.running: dict[int, Any] = {}
        self.wsizes: dict[int, int] = {}
        for k, j in enumerate(state.jobs):
            if j.running:
                key = j.group or j.id
                if key not in places:  # co-located jobs share one placement object, as the contract asks
                    places[key] = tuple((index[w], n) for w, n in j.placement if w in index)
                mates = tuple(keys[key]) if len(keys[key]) > 1 else ()
                m = _Member(j.id, j.procs, True, places[key], mates)
                self.running[k] = m
            else:
                m = _Member(j.id, j.min_procs, False, None, ())
                self.wsizes[m.gpus] = self.wsizes.get(m.gpus, 0) + 1
            self.by_id[j.id] = m
        self.free = [w.slots - state.used.get(w.id, 0) for w in workers]


def replan(state: ClusterState, groups: list[Group], workers: Sequence[WorkerState], out: Plan, name: str) -> Plan:
    """Re-plan ``groups`` (the policy's, highest priority first, over known jobs) on ``workers`` (sorted by id);
    ``out`` may already hold waiting reasons (admission). Rules in the module docstring."""
    view = _Cluster(state, workers, name)
    plan: list[Planned] | None = view.place_in_place(groups)
    if plan is None:
        plan = view.place_fresh(groups)
    by_id = {j.id: j for j in state.jobs}
    free_now = list(view.free)
    placed: set[str] = set()
    for g, members, _need, p in plan:
        where = [(workers[n].id, k) for n, k in p]
        kept = [m for m in members if m.running and m.place is p]
        if kept:  # newcomers join the slots a kept member holds: no new slots
            anchor = by_id[kept[0].id]
            key, can_start = anchor.group or anchor.id, True
        else:
            key = "+".join(g.job_ids) if len(members) > 1 else members[0].id
            can_start = all(free_now[n] >= k for n, k in p)
            if can_start:
                for n, k in p:
                    free_now[n] -= k
        for m in members:
            placed.add(m.id)
            if m.running and m.place is p:
                out.sizes[m.id] = m.gpus
            elif m.running:
                out.stops[m.id] = "preempt"  # moved to other slots or into another group: placed again once stopped
            elif can_start:
                out.starts[m.id] = first_slots(where, m.gpus)
                out.sizes[m.id] = m.gpus
                out.groups[m.id] = key
            else:
                out.waiting[m.id] = f"its slots on {', '.join(w for w, _ in where)} are being freed by this decision"
    for j in state.jobs:
        if j.id in placed:
            continue
        if j.running:
            out.stops[j.id] = "preempt"
        else:
            out.waiting.setdefault(j.id, "not chosen: higher-priority groups take the slots it needs")
    return out
