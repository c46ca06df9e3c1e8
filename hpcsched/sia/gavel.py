"""The Sia artifact's Gavel baseline: rigid jobs time-shared across GPU types in long rounds.

Each job keeps the GPU count and batch size its trace requests ("TunedJobs"). Every round Gavel's
``max_sum_throughput_perf`` allocation (``hpcsched.hetero.policies``: maximise the summed steps/s, the job
sizes within each type's GPUs) gives each job a share ``x`` of each type; the round mechanism then ranks
(job, type) by priority ``x / (time received on the type / time the type has run)`` and fills each type
greedily, keeping a job on its previous GPUs where it can. A job left out is suspended and restarts (the
application's rescale time) when it runs again.

Steps/s of a job on a type is its measured step time at its requested size packed onto that type's nodes
(gradient accumulation where the per-GPU batch exceeds what was measured), times the calibration; a job
larger than a type's menu gets the artifact's token 0.1 steps/s there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hpcsched.sia.job import SiaJob
from hpcsched.sia.policy import CONFIGS_4GPU, CONFIGS_8GPU


@dataclass
class GavelBaseline:
    """Gavel's round mechanism as the Sia artifact runs it; ``solver``: 'ecos' (Gavel's own) or 'highs'."""

    nodes: dict[str, int]
    gpus_per_node: dict[str, int]
    interval: float = 360.0
    solver: str = "highs"
    job_time: dict[str, dict[str, float]] = field(default_factory=dict)
    cluster_time: dict[str, float] = field(default_factory=dict)
    assignments: dict[str, tuple[int, ...]] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from hpcsched.hetero.policies import make_policy

        self.types = sorted(self.nodes)
        self.policy = make_policy("max-sum-throughput-perf", solver=self.solver)
        self.cluster_time = {t: 0.0 for t in self.types}
        self.spec = {t: self.nodes[t] * self.gpus_per_node[t] for t in self.types}
        self.menu_max = {}
        for t in self.types:
            base = CONFIGS_4GPU if self.gpus_per_node[t] == 4 else CONFIGS_8GPU
            self.menu_max[t] = int(base[1][base[0] <= self.nodes[t]][-1])
        self.servers: dict[str, list[list[int]]] = {}
        self.worker_type: dict[int, str] = {}
        self.offset: dict[str, int] = {}
        n = 0
        for t in self.types:
            self.offset[t] = n
            g = self.gpus_per_node[t]
            self.servers[t] = [list(range(n + g * i, n + g * (i + 1))) for i in range(self.nodes[t])]
            for w in range(n, n + self.spec[t]):
                self.worker_type[w] = t
            n += self.spec[t]

    def steps_per_s(self, job: SiaJob, t: str) -> float:
        """The job's steps/s on type ``t`` at its requested size and batch."""
        sf = job.target_num_replicas
        if sf > self.menu_max[t]:
            return 1e-1
        g = self.gpus_per_node[t]
        placement: tuple[int, ...] = ()
        while sum(placement) < sf:
            placement = (*placement, min(sf - sum(placement), g))
        app = job.apps[t]
        local = math.ceil(job.target_batch_size / sf - 1e-8)
        accum = math.ceil(local / app.max_local_bsz_for(placement) - 1e-8) - 1
        if sf == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(app.max_batch_size / (sf * (accum + 1))))
        st, sync = app.step_time(placement, atomic)
        rate = 1 / (st + (st - sync) * accum)
        if not rate > 0:
            raise ValueError(f"{job.name}: no positive step rate on {t} at {sf} GPUs (batch {job.target_batch_size})")
        return rate * job.calibration

    def _allocation(self, jobs: list[SiaJob]) -> dict[str, dict[str, float]]:
        import time

        from hpcsched.hetero.policies import AllocationInput

        ids = sorted(j.name for j in jobs)
        by = {j.name: j for j in jobs}
        thr = np.asarray([[self.steps_per_s(by[i], t) for t in self.types] for i in ids])
        sf = np.asarray([by[i].target_num_replicas for i in ids], dtype=float)
        m = len(ids)
        inp = AllocationInput(job_ids=tuple(range(m)), types=tuple(self.types), throughputs=thr, scale_factors=sf,
                              priority_weights=np.ones(m), steps_remaining=np.ones(m),
                              times_since_start=np.zeros(m), gpus=np.asarray([self.spec[t] for t in self.types],
                                                                           dtype=float))
        t0 = time.perf_counter()
        x = np.clip(np.round(self.policy.allocate(inp), 5), 0.0, 1.0)
        self.stats["solve_s"] = self.stats.get("solve_s", 0.0) + time.perf_counter() - t0
        self.stats["solves"] = self.stats.get("solves", 0) + 1
        return {i: {t: float(x[r, c]) for c, t in enumerate(self.types)} for r, i in enumerate(ids)}

    def optimize(self, jobs: list[SiaJob], now: float) -> dict[str, tuple[str | None, list[int]]]:
        """{job: (GPU type, node index per GPU)} for the jobs that run this round (absent: suspended)."""
        if not jobs:
            return {}
        for j in jobs:
            if j.name not in self.job_time:
                self.job_time[j.name] = {t: self.interval / 2 for t in self.types}
                for t in self.types:
                    self.cluster_time[t] += self.interval / 2
        alloc = self._allocation(jobs)
        prio: dict[str, dict[str, float]] = {t: {} for t in self.types}
        for t in self.types:
            for j in jobs:
                frac = self.job_time[j.name][t] / self.cluster_time[t] if self.cluster_time[t] else 0.0
                x = alloc[j.name][t]
                prio[t][j.name] = x / frac if (x != 0.0 and frac > 0.0) else x * 1e9
        queue = [(j.name, t, prio[t][j.name], 0.0, alloc[j.name][t]) for t in self.types for j in jobs]
        queue.sort(key=lambda e: (e[2], e[3], e[4]), reverse=True)
        left = dict(self.spec)
        size = {j.name: j.target_num_replicas for j in jobs}
        scheduled: dict[str, list[tuple[str, int]]] = {t: [] for t in self.types}
        done: set[str] = set()
        for name, t, *_ in queue:
            if left[t] == 0 or name in done or size[name] > left[t]:
                continue
            left[t] -= size[name]
            done.add(name)
            scheduled[t].append((name, size[name]))
        new = self._assign(scheduled)
        self.assignments = new
        out: dict[str, tuple[str | None, list[int]]] = {}
        for name, workers in new.items():
            t = self.worker_type[workers[0]]
            out[name] = (t, [(w - self.offset[t]) // self.gpus_per_node[t] for w in workers])
            self.job_time[name][t] += self.interval
            self.cluster_time[t] += self.interval
        return out

    def _assign(self, scheduled: dict[str, list[tuple[str, int]]]) -> dict[str, tuple[int, ...]]:
        """Workers per scheduled job: largest jobs first; a job keeps its previous workers when they are all
        still free on the same type; the rest fill servers in order."""
        new: dict[str, tuple[int, ...]] = {}
        prev_type = {name: self.worker_type[w[0]] for name, w in self.assignments.items()}
        for t in self.types:
            jobs = sorted(scheduled[t], key=lambda e: e[1], reverse=True)
            servers = [list(s) for s in self.servers[t]]
            taken: set[int] = set()
            ptr = 0
            for sf_now in sorted({e[1] for e in jobs}, reverse=True):
                for name, sf in jobs:
                    if sf != sf_now or prev_type.get(name) != t:
                        continue
                    prev = self.assignments[name]
                    if not any(w in taken for w in prev):
                        new[name] = prev
                        taken.update(prev)
                for name, sf in jobs:
                    if sf != sf_now:
                        continue
                    got = list(new.get(name, ()))
                    while len(got) < sf and ptr < len(servers):
                        if not servers[ptr]:
                            ptr += 1
                            continue
                        w = servers[ptr][0]
                        if w not in taken:
                            got.append(w)
                            taken.add(w)
                        servers[ptr].pop(0)
                    if len(got) != sf:
                        raise RuntimeError(f"Gavel baseline: could not assign workers to {name}")
                    new[name] = tuple(got)
        return new
