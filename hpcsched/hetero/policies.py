"""Gavel's allocation policies: what fraction of time each job should get on each GPU type.

Each policy maps the active jobs' throughputs (steps/s per type) to an allocation matrix ``x`` (jobs x
types, rows summing to at most 1, ``sum_i scale_i x_ij <= GPUs of type j``); Gavel's round mechanism
(``hpcsched.hetero.rounds``) then turns it into per-round placements. The programs are Gavel's
(OSDI'20, section 4, and its ``scheduler/policies``), written here as LPs:

- ``max-min-fairness-perf``: maximise ``min_i scale_i sum_j T_ij x_ij / (w_i P_i)``, where ``P_i`` is the
  job's throughput on an equal (proportional) share of every type: heterogeneity-aware LAS;
- ``max-min-fairness``: the same with every throughput 1 (the agnostic baseline);
- ``finish-time-fairness-perf``: minimise the worst ratio ``rho_i`` of the job's expected finish time
  under ``x`` to its finish time on a 1/n share of the cluster (Themis's metric);
- ``min-total-duration-perf``: the smallest ``T`` by bisection such that every job can finish within ``T``;
- ``max-sum-throughput-perf``: maximise ``sum_ij T_ij x_ij``;
- ``max-min-fairness-packed``: max-min fairness over single jobs and co-located pairs (space sharing);
- ``fifo``: Gavel's stateful FIFO (jobs in arrival order get a whole GPU type each).

Why an interior-point solve: these programs have many optimal allocations (max-min only fixes the
worst job's share), and Gavel's mechanism follows whichever one its solver (ECOS, an interior-point
method) returns. ``hpcsched.hetero.ipm`` reproduces that choice; HiGHS gives the optimum's value,
which checks it (and is the fallback, counted and reported, when the interior-point method fails).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class AllocationInput:
    """The active jobs, sorted by id, and the GPU types, sorted by name (Gavel's matrix order)."""

    job_ids: tuple[int, ...]
    types: tuple[str, ...]
    throughputs: np.ndarray  # jobs x types, steps/s
    scale_factors: np.ndarray  # GPUs per job
    priority_weights: np.ndarray
    steps_remaining: np.ndarray
    times_since_start: np.ndarray  # s since arrival
    gpus: np.ndarray  # GPUs per type
    job_types: tuple[str, ...] = ()


@dataclass
class GavelPolicy:
    """Base: a name, how the mechanism treats it, and counters of solver trouble (reported per run)."""

    name: str = ""
    heterogeneity_aware: bool = True  # False: the mechanism shuffles the type order every round (as Gavel)
    skip_zero_priority: bool = False
    stats: dict[str, int] = field(default_factory=dict)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        raise NotImplementedError

    def _count(self, key: str, message: str | None = None) -> None:
        """Count a solver event; the first of each kind is said on stderr (nothing degrades silently)."""
        first = key not in self.stats
        self.stats[key] = self.stats.get(key, 0) + 1
        if first and message:
            print(f"warning: {self.name}: {message} (counted in the output as solver.{key})", file=sys.stderr)


@dataclass
class FifoPolicy(GavelPolicy):
    """Gavel's FIFO (``policies/fifo.py``, base mode), kept bug for bug because its figures depend on it.

    Jobs keep the type they were given until they end; a finished job's type goes to the head of the
    queue if it fits; then queued jobs are given types while any type has free GPUs. Gavel draws a type at
    random among those with room (``Random(seed)``), but assigns the job to the *last* type with free
    GPUs in name order, so a type can be over-committed (the mechanism then runs the jobs of highest
    priority); the drawn index only decides which type leaves the list when the assigned one fills up
    exactly. The draw sequence is Gavel's, so ``--seed`` moves the figures slightly, as it moves Gavel's.
    """

    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _given: dict[int, str] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        sf = {j: int(s) for j, s in zip(inp.job_ids, inp.scale_factors, strict=True)}
        thr = {j: dict(zip(inp.types, row, strict=True)) for j, row in zip(inp.job_ids, inp.throughputs, strict=True)}
        free = {t: int(g) for t, g in zip(inp.types, inp.gpus, strict=True)}
        queue = [j for j in inp.job_ids if j not in self._given]
        for j in sorted(self._given):
            wt = self._given[j]
            if j not in thr:  # ended: its type goes to the head of the queue if it fits there
                if queue and sf[queue[0]] <= free[wt] and thr[queue[0]][wt] > 0.0:
                    nxt = queue.pop(0)
                    self._given[nxt] = wt
                    free[wt] -= sf[nxt]
                del self._given[j]
            else:
                free[wt] -= sf[j]
        avail = sorted(t for t in free if free[t] > 0)
        while queue and avail:
            j = queue.pop(0)
            fits = [i for i, t in enumerate(avail) if free[t] >= sf[j]]
            if not fits:
                break
            drawn = self._rng.randrange(len(fits))
            wt = avail[-1]  # Gavel's assignment: the loop variable left over from scanning `avail`
            if thr[j][wt] > 0.0:
                self._given[j] = wt
                free[wt] -= sf[j]
                if free[wt] == 0:
                    avail.pop(fits[drawn])
        x = np.zeros((len(inp.job_ids), len(inp.types)))
        col = {t: c for c, t in enumerate(inp.types)}
        for r, j in enumerate(inp.job_ids):
            if j in self._given:
                x[r, col[self._given[j]]] = 1.0
        return x
