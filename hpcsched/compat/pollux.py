"""``--compat pollux``: the Pollux OSDI'21 artifact's simulator loop (petuum/adaptdl osdi21-artifact, simulator.py).

Written from its semantics (Apache-2.0; code our own). Every round (60 s; a round event of the simulators' event
core, ``hpcsched.primitives.event_core``: ``PolluxRounds``):

1. each submitted job advances: first any re-scale pause (30 s after every reallocation: GPUs held, no
   progress), then at its measured step time and its true statistical efficiency (the profile's gradient
   statistics at its batch and epoch), progress per second = gain / step time; an epoch ends when progress
   reaches the least any validated batch needed, the crossing time is rounded to the second, and the job is
   complete past its last epoch. Between epochs (and on every reallocation) its batch is re-chosen: fixed at the
   workload's batch for Tiresias and Optimus ("TunedJobs"), goodput-optimal from its learned model for Pollux;
2. the policy sees the incomplete submitted jobs (workload order) and returns node lists; a job whose list
   changed is reallocated (its placement = runs of equal nodes in the list).

Jobs learn their step-time model online (the 7-parameter fit on each new (nodes, GPUs, micro-batch) seen) only
when the policy uses it (Pollux); Tiresias and Optimus never read it, so it is not fitted for them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hpcsched.goodput import ApplicationProfile, GoodputFunction, SpeedupFunction, fit_perf_params, load_profile
from hpcsched.goodput.perf import PerfParams
from hpcsched.primitives.event_core import EventCore
from hpcsched.traces.pollux import PolluxJob

MODE = "pollux"
ROUND_S = 60.0
RESCALE_S = 30.0
"""Seconds a job holds its GPUs without progress after each reallocation (checkpoint-restart)."""
NCF_BATCH = 32768
"""Pollux runs ncf at a fixed batch on one GPU (the artifact's setting)."""


class PolluxPolicy(Protocol):
    """A ``--compat pollux`` policy: node lists per job name, given the active jobs and the last allocations."""

    name: str
    learns: bool  # whether jobs must fit their step-time model online (only Pollux reads it)
    fixed_batch: bool  # True: jobs run the workload's batch size (TunedJobs); False: goodput-optimal

    def optimize(self, jobs: dict[str, SimJob], prev: dict[str, list[int]], now: float) -> dict[str, list[int]]: ...


@dataclass
class SimJob:
    """One job's state in the artifact's progress model."""

    name: str
    app: ApplicationProfile
    submission_time: float
    target_num_replicas: int | None = None
    target_batch_size: int | None = None
    learns: bool = False
    completion_time: float | None = None
    current_time: float = 0.0
    rescale_time: float = 0.0
    placement: tuple[int, ...] = ()
    atomic_bsz: int = 0
    accum_steps: int = 0
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    perf_params: PerfParams | None = None
    grad_params: tuple[float, float] | None = None
    progress: float = 0.0
    epoch: int = 0
    attained_service: float = 0.0
    num_restarts: int | None = None
    first_start: float | None = None
    gpu_seconds: float = 0.0
    max_gpus: int = 0
    max_nodes: int = 0

    @property
    def max_profiled_replicas(self) -> int:
        return max((k[1] for k in self.profile), default=0)

    def goodput_fn(self) -> GoodputFunction:
        assert self.perf_params is not None and self.grad_params is not None
        return GoodputFunction(self.perf_params, self.grad_params, self.app.init_batch_size)

    def speedup_fn(self) -> SpeedupFunction | Callable[[Any, Any], Any]:
        """Goodput speedup over one GPU from what the job has learned; before any observation, linear."""
        if self.perf_params is None:
            return lambda n, r: r
        a = self.app
        return SpeedupFunction(self.goodput_fn(), a.max_batch_size, (a.min_local_bsz, a.max_local_bsz),
                               accumulation=True)

    def update_local_bsz(self, placement: tuple[int, ...]) -> None:
        """Choose (micro-batch, accumulation) for ``placement``: the target batch split over it, or (no target)
        the goodput-optimal one from the learned model (B0 or the smallest micro-batches before any)."""
        a = self.app
        placement = tuple(p for p in placement if p)
        nodes, reps = len(placement), sum(placement)
        batch = self.target_batch_size
        if batch is None and self.perf_params is None:
            batch = max(a.init_batch_size, a.min_local_bsz * reps)
        if batch is None:
            _, self.atomic_bsz, self.accum_steps = self.goodput_fn().optimize(
                nodes, reps, a.max_batch_size, (a.min_local_bsz, a.max_local_bsz), accumulation=True)
        else:
            local = math.ceil(batch / reps - 1e-8)
            self.accum_steps = math.ceil(local / a.max_local_bsz - 1e-8) - 1
            if reps == 1 and batch > a.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.atomic_bsz = math.ceil(local / (self.accum_steps + 1) - 1e-8)
        count = reps * (self.accum_steps + 1)
        self.atomic_bsz = min(self.atomic_bsz, int(a.max_batch_size / count))

    def update_params(self, nodes: int, reps: int, local_bsz: int, step_time: float, sync_time: float,
                      grad_sqr: float, grad_var: float) -> None:
        self.grad_params = (grad_sqr, grad_var)
        if (nodes, reps, local_bsz) in self.profile:
            return
        self.profile[nodes, reps, local_bsz] = step_time, sync_time
        if not self.learns:
            return
        keys = list(self.profile)
        vals = list(self.profile.values())
        st = np.array([v[0] for v in vals])
        sy = np.array([v[1] for v in vals])
        self.perf_params = fit_perf_params(np.array([k[0] for k in keys]), np.array([k[1] for k in keys]),
                                           np.array([k[2] for k in keys]), st - sy, st)

    def step(self, now: float, seconds: float) -> None:
        """Advance ``seconds`` of wall-clock time from ``now`` (a job not placed only waits: the loop skips it)."""
        self.current_time = now
        if not self.placement:
            return
        gpus = sum(self.placement)
        delay = min(self.rescale_time, seconds)
        self.current_time += delay
        self.attained_service += delay * gpus
        if self.completion_time is None:
            self.gpu_seconds += delay * gpus
        self.rescale_time -= delay
        seconds -= delay
        a = self.app
        while seconds > 0 and self.completion_time is None:
            placement = tuple(p for p in self.placement if p)
            nodes, reps = len(placement), sum(placement)
            batch = reps * self.atomic_bsz * (self.accum_steps + 1)
            scale = batch / a.init_batch_size
            step_time, sync_time = a.step_time(placement, self.atomic_bsz)
            accum_time = step_time - sync_time
            grad_sqr, grad_var = a.grad_stats(batch, self.epoch)
            gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
            self.update_params(nodes, reps, self.atomic_bsz, step_time, sync_time, grad_sqr, grad_var)
            goodput = gain / (step_time + accum_time * self.accum_steps)
            next_progress = a.progress_at(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                self.progress += goodput * seconds
                self.current_time += seconds
                self.attained_service += seconds * gpus
                self.gpu_seconds += seconds * gpus
                seconds = 0
            else:
                self.epoch += 1
                delta = round(float((next_progress - self.progress) / goodput))
                if delta > seconds:
                    raise AssertionError(f"{self.name}: epoch crossing {delta} s after a {seconds} s interval")
                if self.epoch > a.completion_epoch(batch):
                    self.completion_time = self.current_time + delta
                self.progress = next_progress
                self.current_time += delta
                self.attained_service += delta * gpus
                self.gpu_seconds += delta * gpus
                seconds -= delta
            self.update_local_bsz(self.placement)
        self.current_time += seconds

    def reallocate(self, placement: list[int], now: float) -> None:
        if placement:
            self.placement = tuple(placement)
            self.update_local_bsz(self.placement)
            self.rescale_time = RESCALE_S
            self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1
            if self.first_start is None:
                self.first_start = now
            self.max_gpus = max(self.max_gpus, sum(placement))
            self.max_nodes = max(self.max_nodes, len(placement))
        else:
            self.placement = ()
            self.atomic_bsz = 0


def placement_of(alloc: Sequence[int]) -> list[int]:
    """GPUs per node from a node list: runs of equal consecutive entries ([3, 3, 5] -> [2, 1])."""
    out: list[int] = []
    for i, node in enumerate(alloc):
        if i == 0 or node != alloc[i - 1]:
            out.append(1)
        else:
            out[-1] += 1
    return out


@dataclass
class PolluxRun:
    """A finished ``--compat pollux`` simulation."""

    jobs: list[SimJob]
    rounds: list[tuple[float, int, int, int]]  # time, busy GPUs, running jobs, active jobs
    wall_s: float
    meta: dict[str, Any]

    def jcts(self) -> dict[str, float]:
        return {j.name: j.completion_time - j.submission_time for j in self.jobs if j.completion_time is not None}


def make_jobs(workload: Sequence[PolluxJob], policy: PolluxPolicy,
              profiles: dict[str, ApplicationProfile] | None = None) -> list[SimJob]:
    """The simulator's jobs: the TunedJobs request for Tiresias (GPUs and batch) and Optimus (batch only);
    nothing for Pollux but ncf's fixed batch."""
    profiles = {} if profiles is None else profiles
    jobs = []
    for w in workload:
        if w.application not in profiles:
            profiles[w.application] = load_profile(w.application)
        job = SimJob(w.name, profiles[w.application], w.time, learns=policy.learns)
        if policy.fixed_batch:
            job.target_batch_size = w.batch_size
            job.target_num_replicas = w.num_replicas
        elif w.application == "ncf":
            job.target_batch_size = NCF_BATCH
        jobs.append(job)
    return jobs


class PolluxRounds:
    """The artifact's round loop as a strategy of the event core (``hpcsched.primitives.event_core``): a round
    event every ``round_s`` while a job is pending or incomplete (and before ``max_time``). The event is at the
    round's end: the running jobs advance over the round just past, the arrivals join, and the policy
    re-allocates."""

    def __init__(self, jobs: list[SimJob], policy: PolluxPolicy, nodes: int, gpus_per_node: int, round_s: float,
                 max_time: float | None, on_round: Callable[[float, int], None] | None) -> None:
        self.policy, self.nodes, self.gpus_per_node, self.round_s = policy, nodes, gpus_per_node, round_s
        self.max_time, self.on_round = max_time, on_round
        self.now = 0.0  # the last round's end: the start of the round the next event ends
        self.allocations: dict[str, list[int]] = {}
        self.rounds: list[tuple[float, int, int, int]] = []
        self.pending = sorted(jobs, key=lambda j: j.submission_time)  # not yet submitted, by submission
        self.submitted: list[SimJob] = []  # submitted and incomplete, in workload order
        self.order = {j.name: i for i, j in enumerate(jobs)}

    def next_round(self, t: float) -> float | None:
        if not (self.pending or self.submitted) or (self.max_time is not None and t >= self.max_time):
            return None
        return t + self.round_s

    def done(self) -> bool:
        return False  # the rounds stop themselves (``next_round``)

    def handle(self, now: float, event: object) -> None:
        pending, policy, nodes, gpus_per_node = self.pending, self.policy, self.nodes, self.gpus_per_node
        for j in self.submitted:
            if j.placement:
                j.step(self.now, self.round_s)
        self.now = now
        arrived = False
        submitted = self.submitted
        while pending and pending[0].submission_time <= now:
            submitted.append(pending.pop(0))
            arrived = True
        if arrived:
            submitted.sort(key=lambda j: self.order[j.name])
        submitted = self.submitted = [j for j in submitted if j.completion_time is None]
        active = {j.name: j for j in submitted}
        if active:
            allocations = {k: v for k, v in self.allocations.items() if k in active}
            new = policy.optimize(active, allocations, now)
            used: dict[int, int] = {}
            for alloc in new.values():
                for n in alloc:
                    used[n] = used.get(n, 0) + 1
            if any(n < 0 or n >= nodes or c > gpus_per_node for n, c in used.items()):
                raise AssertionError(f"{policy.name}: over-allocated nodes at t={now}: {used}")
            for j in submitted:
                if new.get(j.name) != allocations.get(j.name):
                    j.reallocate(placement_of(new.get(j.name, [])), now)
            self.allocations = new
            busy = sum(len(v) for v in new.values())
            self.rounds.append((now, busy, sum(1 for v in new.values() if v), len(active)))
        if self.on_round is not None:
            self.on_round(now, len(active))


def simulate_pollux(workload: Sequence[PolluxJob], policy: PolluxPolicy, nodes: int = 16, gpus_per_node: int = 4,
                    round_s: float = ROUND_S, max_time: float | None = None,
                    on_round: Callable[[float, int], None] | None = None) -> PolluxRun:
    """Run ``workload`` under ``policy`` on ``nodes`` x ``gpus_per_node`` GPUs until every job completes (or
    ``max_time`` of simulated time: then the rest are reported unfinished)."""
    if not round_s > 0:
        raise ValueError(f"the round must be > 0 s, got {round_s}")
    t0 = time.perf_counter()
    jobs = make_jobs(workload, policy)
    loop = PolluxRounds(jobs, policy, nodes, gpus_per_node, round_s, max_time, on_round)
    core = EventCore()
    core.start_rounds(loop.next_round(0.0))
    core.run(loop)
    rounds = loop.rounds
    meta = {"compat": MODE, "policy": policy.name, "round_s": round_s, "rescale_s": RESCALE_S, "nodes": nodes,
            "gpus_per_node": gpus_per_node, "jobs": len(jobs), "rounds": len(rounds),
            "restarts": sum(j.num_restarts or 0 for j in jobs)}
    return PolluxRun(jobs, rounds, time.perf_counter() - t0, meta)
