"""One scheduling step of the controller, as a pure function of what the controller knows.

order (the simulator's policies) -> sizes (each admitted job gets min_procs, then elastic jobs grow to
max_procs in priority order) -> placement (the simulator's consolidated placement) -> a Plan of starts
and stops. No RPC, no database, no clock: the controller builds a ``ClusterState`` under its lock,
calls ``plan`` and applies the result, so this step is tested on hand-checkable cases alone.

Interleaving groups returned by a policy are flattened to their priority order: the runtime does not
co-locate a group's jobs on shared devices (yet), it runs each on its own slots.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from hpcsched.allocator import JobView, Snapshot
from hpcsched.model import ClusterSpec, ResourceProfile
from hpcsched.policies import get_policy
from hpcsched.sim.placement import place_consolidated

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobState:
    """What the scheduler sees of one pending or running job."""

    id: str
    submit: float
    running: bool
    procs: int  # current size when running, else 0
    min_procs: int
    max_procs: int
    launcher: str = "torchrun"
    steps_total: int | None = None
    steps_done: int = 0
    iteration_s: float | None = None
    profile: ResourceProfile | None = None
    attained_s: float = 0.0
    executed_s: float = 0.0
    first_start: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerState:
    id: str
    slots: int
    launchers: tuple[str, ...] = ("torchrun",)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """``used`` counts the slots held by running and stopping jobs on each live worker."""

    now: float
    jobs: tuple[JobState, ...]
    workers: tuple[WorkerState, ...]
    used: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    """``starts``: job -> [(worker, procs)]; ``stops``: job -> reason ('preempt' or 'resize')."""

    starts: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    stops: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # every admitted job's size this round
    waiting: dict[str, str] = field(default_factory=dict)  # job -> why it did not start


def _fifo(snapshot: Snapshot) -> list:
    from hpcsched.allocator import Group

    return [Group((j.id,)) for j in sorted(snapshot.jobs, key=lambda j: (j.submit, j.id))]


def resolve_policy(name: str):
    """The registered policy; plain FIFO only while no policy named 'fifo' is registered."""
    try:
        return get_policy(name)
    except KeyError:
        if name == "fifo":
            return _fifo
        raise


def _views(state: ClusterState) -> tuple[JobView, ...]:
    out = []
    for j in state.jobs:
        size = j.procs if j.running else j.min_procs
        remaining = None
        if j.steps_total is not None and j.iteration_s is not None:
            remaining = max(0, j.steps_total - j.steps_done) * j.iteration_s
        out.append(JobView(
            id=j.id, submit=j.submit, gpus=size, iterations_total=j.steps_total, iterations_done=j.steps_done,
            iteration_time=j.iteration_s, attained_gpu_s=j.attained_s, executed_s=j.executed_s,
            remaining_s=remaining, profile=j.profile, running=j.running, first_start=j.first_start,
        ))
    return tuple(out)


def plan(state: ClusterState, policy_name: str = "fifo") -> Plan:
    """Decide which jobs run, at which size, and where new ones go."""
    out = Plan()
    if not state.jobs:
        return out
    workers = sorted(state.workers, key=lambda w: w.id)
    total = sum(w.slots for w in workers)
    gpn = max((w.slots for w in workers), default=1) or 1
    spec = ClusterSpec(switches=1, nodes_per_switch=max(1, len(workers)), gpus_per_node=gpn)
    snap = Snapshot(now=state.now, jobs=_views(state), cluster=spec,
                    free_gpus=max(0, total - sum(state.used.values())))
    by_id = {j.id: j for j in state.jobs}
    order: list[str] = []
    for g in resolve_policy(policy_name)(snap):
        order += [i for i in g.job_ids if i in by_id and i not in order]
    order += [j.id for j in state.jobs if j.id not in order]  # a policy that drops a job must not lose it

    left = total
    for jid in order:  # admit at minimum size, highest priority first
        j = by_id[jid]
        if j.min_procs <= left:
            out.sizes[jid] = j.min_procs
            left -= j.min_procs
        else:
            out.waiting[jid] = f"needs {j.min_procs} slots, {left} left after higher-priority jobs"
    for jid in order:  # then grow elastic jobs into what is left
        if jid in out.sizes and left > 0:
            grow = min(by_id[jid].max_procs - out.sizes[jid], left)
            out.sizes[jid] += grow
            left -= grow
    for jid in order:  # settle running jobs first: they already hold their slots
        j = by_id[jid]
        if not j.running:
            continue
        if jid not in out.sizes:
            out.stops[jid] = "preempt"
        elif out.sizes[jid] != j.procs:
            out.stops[jid] = "resize"

    free = {w.id: w.slots - state.used.get(w.id, 0) for w in workers}
    for jid in order:
        j = by_id[jid]
        if j.running or jid not in out.sizes:
            continue
        able = [w for w in workers if j.launcher in w.launchers]
        got = place_consolidated([max(0, free[w.id]) for w in able], out.sizes[jid], gpn)
        if got is None:
            out.waiting[jid] = f"{out.sizes[jid]} slots do not fit on free slots {free}"
            continue
        out.starts[jid] = [(able[i].id, k) for i, k in got]
        for i, k in got:
            free[able[i].id] -= k
    return out
