"""The simulator deciding through the shared decision core, exactly as the runtime's controller decides.

Why: the policy a researcher measures in simulation must be the policy the cluster runs. The engine's own
planner (default and compat modes) re-plans groups from scratch and may move running jobs together to form
them; the controller never does, protects young attempts, and learns what it knows of a job from the job's
own reports (rules in ``hpcsched.core.decide``). With ``AsController`` the engine builds, at every decision,
the ``ClusterState`` the controller would build, calls ``decide`` with the controller's options and applies
the ``Plan``; so the simulated sequence of starts and stops is the controller's (``tests/test_parity.py``
runs both on one trace and compares them).

What is modelled the controller's way, and why:

- Knowledge: a job that has never run shows the policy no iteration time, no remaining time and no profile
  (the controller learns them from the job's progress reports), unless its job file declares a profile
  (``declared``: then its iteration time is the profile's total, as ``runtime.controller`` reads it).
- Workers: node ``i`` is the worker ``n<i>`` (zero-padded, so the core's worker order is the node order)
  with ``gpus_per_node`` slots. Switches are not seen: the controller does not know them.
- Stops take effect before the starts that need their slots: ``decide`` places starts on the slots free
  before its stops, and the engine decides again at the same instant once the stopped jobs are gone, as
  the controller's next tick does once they have checkpointed.
- A co-located set (jobs sharing slots) runs at the pipeline period of its members' stage profiles
  (``hpcsched.interleave.period``) times the engine's group factor; a member without a profile counts as
  compute-only (its iteration time in the compute stage).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcsched.allocator import Group, Policy
from hpcsched.core.decide import ClusterState, DecideOptions, DecideRequest, JobState, Plan, WorkerState, decide
from hpcsched.model import ResourceProfile

if TYPE_CHECKING:
    from hpcsched.core.replan import Planned
    from hpcsched.sim.jobrun import EngineJob

MAX_ROUNDS = 16
"""Decisions at one instant before the engine gives up: each round after the first follows stops, and a
stopped job cannot be stopped again at the same instant, so more rounds than that mean a policy that flips
its answer with no time passing."""


@dataclass(frozen=True, slots=True)
class AsController:
    """Run every decision of a simulation through ``hpcsched.core.decide`` as the runtime's controller does.

    ``options``: the controller's (``min_runtime_s``: its hysteresis, in trace seconds; ``tfwd_s``).
    ``declared``: job id -> the stage profile its job file declares (trace seconds), shown to the policy
    before the job has run (``hpcsched testbed --declare-profiles``)."""

    options: DecideOptions = DecideOptions()
    declared: Mapping[str, ResourceProfile] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """One start or stop the core decided, as the controller's event log records it."""

    time: float
    kind: str  # "start" or "stop"
    job: str
    procs: int  # start: its size; stop: the size it had
    workers: tuple[str, ...] = ()  # start: where, node-rank order
    reason: str = ""  # stop: "preempt" or "resize"


class CoreDecider:
    """One run's decisions through the core: the co-location keys and attempt starts the controller keeps,
    and the log of what was decided."""

    def __init__(self, spec: AsController, policy: Policy, nodes: int, gpus_per_node: int) -> None:
        width = len(str(max(0, nodes - 1)))
        self.names = [f"n{i:0{width}d}" for i in range(nodes)]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.workers = tuple(WorkerState(n, gpus_per_node) for n in self.names)
        self.gpn = gpus_per_node
        self.policy = policy
        self.spec = spec
        self.keys: dict[str, str] = {}  # running job -> co-location key of its slots
        self.attempt: dict[str, float] = {}  # running job -> when its current attempt started
        self.log: list[DecisionEvent] = []
        self.untimed: set[str] = set()  # co-located jobs without a stage profile, timed as compute-only

    def state(self, active: Iterable[EngineJob], free: list[int], t: float) -> ClusterState:
        """What the controller would see now: the active jobs as it knows them, the workers and their use."""
        used = {self.names[i]: self.gpn - f for i, f in enumerate(free) if f < self.gpn}
        return ClusterState(now=t, jobs=tuple(self._job(j) for j in active), workers=self.workers, used=used)

    def plan(self, state: ClusterState) -> Plan:
        return decide(DecideRequest(state, self.policy, self.spec.options))

    def apply(self, plan: Plan, active: Sequence[EngineJob], t: float) -> list[Planned]:
        """The engine's plan (every group that runs from now on, with its GPUs) for the core's ``plan``; logs
        its stops and starts and keeps the co-location keys and attempt starts up to date."""
        by_key: dict[str, list[EngineJob]] = {}
        for j in active:
            if j.running and j.id not in plan.stops:
                by_key.setdefault(self.keys[j.id], []).append(j)
            elif j.id in plan.starts:
                by_key.setdefault(plan.groups[j.id], []).append(j)
        for jid, reason in plan.stops.items():
            self.log.append(DecisionEvent(t, "stop", jid, self._procs(jid, active), reason=reason))
            self.keys.pop(jid, None)
            self.attempt.pop(jid, None)
        for jid, where in plan.starts.items():
            self.log.append(DecisionEvent(t, "start", jid, sum(k for _, k in where), tuple(w for w, _ in where)))
            self.keys[jid] = plan.groups[jid]
            self.attempt[jid] = t
        out: list[Planned] = []
        for members in by_key.values():
            kept = next((m.place for m in members if m.running and m.id not in plan.stops), None)
            place = kept if kept is not None else self._place(plan.starts[max(members, key=_gpus).id])
            need = max(m.gpus for m in members)
            if len(members) == 1:
                out.append((members[0].solo, (members[0],), need, place))
            else:
                ids = tuple(m.id for m in members)
                self.untimed.update(m.id for m in members if not _profiled(m))
                out.append((Group(ids, _period(members)), tuple(members), need, place))
        return out

    def _job(self, j: EngineJob) -> JobState:
        declared = self.spec.declared.get(j.id)
        if j.ever_ran:
            it, profile = j.it, j.job.profile
        elif declared is not None and declared.total_s > 0:
            it, profile = declared.total_s, declared
        else:
            it, profile = None, None
        running = j.running
        return JobState(
            id=j.id, submit=j.submit, running=running, procs=j.gpus if running else 0, min_procs=j.gpus,
            max_procs=j.gpus, steps_total=round(j.total), steps_done=int(j.done), iteration_s=it, profile=profile,
            attained_s=j.attained, executed_s=j.executed, first_start=j.first_start,
            group=self.keys.get(j.id) if running else None,
            placement=tuple((self.names[n], k) for n, k in j.place) if running and j.place else (),
            attempt_start=self.attempt.get(j.id) if running else None,
        )

    def _place(self, where: list[tuple[str, int]]) -> tuple[tuple[int, int], ...]:
        return tuple((self.index[w], k) for w, k in where)

    @staticmethod
    def _procs(jid: str, active: Sequence[EngineJob]) -> int:
        return next((j.gpus for j in active if j.id == jid), 0)


def _gpus(j: EngineJob) -> int:
    return j.gpus


def _profiled(m: EngineJob) -> bool:
    return m.job.profile is not None and m.job.profile.total_s > 0


def _period(members: list[EngineJob]) -> float:
    """Raw pipeline period of co-located jobs from their stage profiles (compute-only where unknown; the
    engine counts those jobs in ``meta.json`` as ``untimed_colocated_jobs``)."""
    import numpy as np

    from hpcsched.interleave.period import pipeline_periods

    stages = [m.job.profile.stages() if _profiled(m) else (0.0, m.it, 0.0) for m in members]
    return float(pipeline_periods(np.asarray([stages], dtype=float))[0][0])
