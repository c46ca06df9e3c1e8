"""The Pollux artifact's baselines, Tiresias+TunedJobs and Optimus+Oracle+TunedJobs (simulator/tiresias.py,
optimus.py; semantics reproduced, code our own).

Both place a job's GPUs by repeatedly taking the node with the most free GPUs (first such node on ties, nodes in
index order), and keep a running job's nodes while its GPU count is unchanged.
"""

from __future__ import annotations

import math
from collections import Counter

from hpcsched.compat.pollux import SimJob
from hpcsched.goodput import packed_placement

QUEUE_THRESHOLD = 3600 * 16
"""Tiresias' demotion threshold: GPU-seconds of executed time (executed seconds x requested GPUs)."""


def _free(nodes: int, gpus_per_node: int, allocations: dict[str, list[int]]) -> Counter[int]:
    used: Counter[int] = Counter()
    for alloc in allocations.values():
        used.update(alloc)
    return Counter({n: gpus_per_node for n in range(nodes)}) - used


def _take(free: Counter[int], count: int) -> list[int]:
    """``count`` GPUs, node by node, always from the node with the most free (first of equals)."""
    out: list[int] = []
    while len(out) < count:
        node, avail = free.most_common(1)[0]
        num = min(avail, count - len(out))
        out.extend([node] * num)
        free[node] -= num
    return out


class TiresiasPolicy:
    """Two-queue discretised least-attained-service: jobs start in queue 0, drop to queue 1 once executed
    seconds x requested GPUs reach :data:`QUEUE_THRESHOLD`; within a queue, arrival order; a job runs (at its
    requested GPU count) when it fits in what earlier jobs left, else is preempted. No starvation fix (the
    artifact's is off). Executed time counts whole seconds between scheduling events while running."""

    name = "tiresias"
    learns = False
    fixed_batch = True

    def __init__(self, nodes: int = 16, gpus_per_node: int = 4) -> None:
        self.nodes, self.gpus_per_node = nodes, gpus_per_node
        self._q0: list[str] = []
        self._q1: list[str] = []
        self._status: dict[str, str] = {}
        self._last_check: Counter[str] = Counter()
        self._executed: Counter[str] = Counter()

    def optimize(self, jobs: dict[str, SimJob], prev: dict[str, list[int]], now: float) -> dict[str, list[int]]:
        t = int(now)
        self._q0 = [k for k in self._q0 if k in jobs]
        self._q1 = [k for k in self._q1 if k in jobs]
        self._status = {k: v for k, v in self._status.items() if k in jobs}
        allocations = {k: v for k, v in prev.items() if k in jobs}
        for k in jobs:
            if k not in self._status:
                self._status[k] = "PENDING"
                self._q0.append(k)
        for k, job in jobs.items():
            if self._status[k] == "RUNNING":
                self._executed[k] = int(self._executed[k] + int(t - self._last_check[k]))
                self._last_check[k] = t
                if k in self._q0 and int(self._executed[k] * self._replicas(job)) >= QUEUE_THRESHOLD:
                    self._q0.remove(k)
                    self._q1.append(k)
            else:
                self._last_check[k] = t
        capacity = self.nodes * self.gpus_per_node
        for queue in (self._q0, self._q1):
            for k in queue:
                need = self._replicas(jobs[k])
                if need <= capacity:
                    self._status[k] = "RUNNING"
                    capacity -= need
                else:
                    self._status[k] = "PENDING"
                    allocations.pop(k, None)
        free = _free(self.nodes, self.gpus_per_node, allocations)
        for queue in (self._q0, self._q1):
            for k in queue:
                if self._status[k] == "RUNNING" and not allocations.get(k):
                    allocations[k] = _take(free, self._replicas(jobs[k]))
        return allocations

    @staticmethod
    def _replicas(job: SimJob) -> int:
        assert job.target_num_replicas is not None
        return job.target_num_replicas


class OptimusPolicy:
    """Greedy marginal gain with an oracle: every job gets one GPU, then GPUs go one at a time to the job whose
    remaining time drops most -- (step time at r - at r+1) x remaining iterations, with the true (profiled) step
    time of a packed placement at the workload's batch -- up to batch / smallest micro-batch GPUs (ncf: 1)."""

    name = "optimus"
    learns = False
    fixed_batch = True

    def __init__(self, nodes: int = 16, gpus_per_node: int = 4) -> None:
        self.nodes, self.gpus_per_node = nodes, gpus_per_node

    def optimize(self, jobs: dict[str, SimJob], prev: dict[str, list[int]], now: float) -> dict[str, list[int]]:
        allocations = {k: v for k, v in prev.items() if k in jobs}
        remaining: dict[str, float] = {}
        for k, job in jobs.items():
            b = self._batch(job)
            last = job.app.completion_epoch(b)
            remaining[k] = 1 if last <= job.epoch else (job.app.iterations(b, last) - job.app.iterations(b, job.epoch))
        gpus = self.nodes * self.gpus_per_node
        replicas: dict[str, int] = {}
        gain: dict[str, float] = {}
        for k, job in jobs.items():
            if gpus < 1:
                replicas[k], gain[k] = 0, 0
                continue
            replicas[k] = 1
            gpus -= 1
            gain[k] = self._gain(job, 1, remaining[k], gpus)
        while gpus > 0 and max(gain.values()) > 0:
            k = max(gain, key=lambda key: gain[key])
            replicas[k] += 1
            gpus -= 1
            gain[k] = self._gain(jobs[k], replicas[k], remaining[k], gpus + 1)
        allocations = {k: v for k, v in allocations.items() if len(v) == replicas[k]}
        free = _free(self.nodes, self.gpus_per_node, allocations)
        for k in sorted(jobs, key=lambda key: replicas[key]):
            if replicas[k] > 0 and not allocations.get(k):
                allocations[k] = _take(free, replicas[k])
        return allocations

    @staticmethod
    def _batch(job: SimJob) -> int:
        assert job.target_batch_size is not None
        return job.target_batch_size

    def _max_replicas(self, job: SimJob) -> int:
        return 1 if job.app.name == "ncf" else self._batch(job) // job.app.min_local_bsz

    def _gain(self, job: SimJob, r: int, remaining: float, gpus_left: int) -> float:
        """Time saved by one more GPU; 0 when the job is at its cap or no GPU is left (checked before taking)."""
        if r + 1 > self._max_replicas(job) or gpus_left < 1:
            return 0
        return (self.step_time(job, r) - self.step_time(job, r + 1)) * remaining

    @staticmethod
    def step_time(job: SimJob, r: int) -> float:
        """Profiled seconds per step of the workload's batch on ``r`` packed GPUs (accumulating as needed)."""
        a = job.app
        b = job.target_batch_size
        assert b is not None
        local = math.ceil(b / r - 1e-8)
        accum = math.ceil(local / a.max_local_bsz - 1e-8) - 1
        if r == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(a.max_batch_size / (r * (accum + 1))))
        step, sync = a.step_time(packed_placement(r), atomic)
        return step + (step - sync) * accum
