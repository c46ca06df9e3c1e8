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


# ---- LPs -----------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Rows:
    """Constraint rows in compressed form, built up by ``add``."""

    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    index: list[np.ndarray] = field(default_factory=list)
    value: list[np.ndarray] = field(default_factory=list)
    nnz: int = 0

    def add(self, index: np.ndarray, value: np.ndarray, lo: float, hi: float) -> None:
        self.starts.append(self.nnz)
        self.index.append(index)
        self.value.append(value)
        self.lo.append(lo)
        self.hi.append(hi)
        self.nnz += len(index)


def _base_rows(m: int, n: int, sf: np.ndarray, gpus: np.ndarray) -> _Rows:
    """Gavel's base constraints on x (row-major, m x n): per type ``sum_i sf_i x_ij <= GPUs``, per job
    ``sum_j x_ij <= 1`` (``x >= 0`` is the variables' bound)."""
    import numpy as np

    rows = _Rows()
    inf = float("inf")
    for j in range(n):
        rows.add(np.arange(m) * n + j, sf.astype(float), -inf, float(gpus[j]))
    ones = np.ones(n)
    for i in range(m):
        rows.add(np.arange(i * n, i * n + n), ones, -inf, 1.0)
    return rows


def _solve(policy: GavelPolicy, n_vars: int, cost: np.ndarray, lb: np.ndarray, ub: np.ndarray,
           rows: _Rows) -> np.ndarray:
    """Minimise ``cost @ v`` over the rows with HiGHS's interior-point method, crossover off.

    Why interior point without crossover: among equally optimal allocations it returns one inside the
    optimal face, as Gavel's ECOS does, rather than a vertex (which starves every job it can; the round
    mechanism then runs a different schedule). A status other than optimal is counted and said once.
    """
    import highspy
    import numpy as np

    from hpcsched.solvers.highs import new_highs, run

    h = new_highs()
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    h.setOptionValue("presolve", "off")
    inf = highspy.kHighsInf
    h.addVars(n_vars, np.where(np.isinf(lb), -inf, lb), np.where(np.isinf(ub), inf, ub))
    h.changeColsCost(n_vars, np.arange(n_vars, dtype=np.int32), cost)
    lo = np.array(rows.lo)
    hi = np.array(rows.hi)
    h.addRows(len(lo), np.where(np.isinf(lo), -inf, lo), np.where(np.isinf(hi), inf, hi), rows.nnz,
              np.array(rows.starts, dtype=np.int32), np.concatenate(rows.index).astype(np.int32),
              np.concatenate(rows.value).astype(float))
    status = run(h)
    policy._count("lp_solves")
    if status != highspy.HighsModelStatus.kOptimal:
        policy._count("lp_not_optimal", f"HiGHS returned {h.modelStatusToString(status)}; its last point is used, "
                                        "as Gavel uses ECOS's")
    return np.array(h.getSolution().col_value)


def _max_min(policy: GavelPolicy, coef: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """max t s.t. t <= sum_j coef_ij x_ij for every job i, under the base constraints; returns x."""
    import numpy as np

    m, n = coef.shape
    nv = m * n + 1
    rows = _base_rows(m, n, sf, gpus)
    for i in range(m):
        rows.add(np.append(np.arange(i * n, i * n + n), nv - 1), np.append(coef[i], -1.0), 0.0, float("inf"))
    cost = np.zeros(nv)
    cost[-1] = -1.0
    lb = np.zeros(nv)
    lb[-1] = -np.inf
    v = _solve(policy, nv, cost, lb, np.full(nv, np.inf), rows)
    return v[:-1].reshape(m, n)


def _proportional(thr: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """Each job's throughput on an equal share of every type (Gavel's ``ProportionalPolicy``)."""
    return (thr * (gpus / gpus.sum())).sum(axis=1)


@dataclass
class MaxMinFairnessPerf(GavelPolicy):
    """Heterogeneity-aware max-min fairness (Gavel's ``max_min_fairness_perf``)."""

    agnostic: bool = False  # every throughput 1: Gavel's ``max_min_fairness`` (LAS)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.ones_like(inp.throughputs) if self.agnostic else inp.throughputs
        coef = thr / (inp.priority_weights * _proportional(thr, inp.gpus))[:, None] * inp.scale_factors[:, None]
        return np.clip(_max_min(self, coef, inp.scale_factors, inp.gpus), 0.0, 1.0)


@dataclass
class MaxSumThroughputPerf(GavelPolicy):
    """Maximise the summed throughput (steps/s) of all jobs (Gavel's ``max_sum_throughput_perf``)."""

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        m, n = inp.throughputs.shape
        rows = _base_rows(m, n, inp.scale_factors, inp.gpus)
        v = _solve(self, m * n, -inp.throughputs.ravel(), np.zeros(m * n), np.full(m * n, np.inf), rows)
        return np.clip(v.reshape(m, n), 0.0, 1.0)


def _isolated(thr: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """Each job's throughput on a 1/m share of every type (Gavel's ``IsolatedPolicy``): the reference
    finish-time fairness compares against."""
    import numpy as np

    m = len(thr)
    x = np.tile(gpus / m, (m, 1)) / sf[:, None]
    x = x / np.maximum(x.sum(axis=1), 1.0)[:, None]
    return (thr * x).sum(axis=1)


@dataclass
class FinishTimeFairnessPerf(GavelPolicy):
    """Minimise the worst rho = (time since arrival + remaining steps / throughput under x) / (the job's
    finish time on its isolated share, counting progress so far at the isolated speed) (Gavel's
    ``finish_time_fairness_perf``).

    Gavel states it with ``inv_pos`` (a second-order cone program); for a fixed rho the constraints are
    linear (each job needs throughput ``rem / (rho E - elapsed)``), so rho* is found by a Dinkelbach-style
    iteration of max-min LPs, each lowering rho to what its allocation achieves, until it stops moving.
    """

    _cum_iso: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _prev_rem: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _prev_iso: dict[int, float] = field(init=False, repr=False, default_factory=dict)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr, sf, rem, since = inp.throughputs, inp.scale_factors, inp.steps_remaining, inp.times_since_start
        iso = _isolated(thr, sf, inp.gpus)
        for r, j in enumerate(inp.job_ids):
            c = self._cum_iso.setdefault(j, 0.0)
            if j in self._prev_rem:
                self._cum_iso[j] = c + (self._prev_rem[j] - rem[r]) / self._prev_iso[j]
        e_iso = np.array([self._cum_iso[j] for j in inp.job_ids]) + rem / iso
        self._prev_rem = dict(zip(inp.job_ids, rem, strict=True))
        self._prev_iso = dict(zip(inp.job_ids, iso, strict=True))

        def rho_of(x: np.ndarray) -> float:
            y = (thr * x).sum(axis=1)
            with np.errstate(divide="ignore"):
                return float(np.max((since + np.where(y > 0, rem / np.where(y > 0, y, 1), np.inf)) / e_iso))

        m, n = thr.shape
        x_iso = np.tile(inp.gpus / m, (m, 1)) / sf[:, None]
        x = x_iso / np.maximum(x_iso.sum(axis=1), 1.0)[:, None]
        hi = rho_of(x)  # the isolated share is feasible: an upper bound
        best_alone = (thr * np.minimum(1.0, inp.gpus[None, :] / sf[:, None])).max(axis=1)
        lo = float(np.max((since + rem / best_alone) / e_iso))  # each job alone on its best type: a lower bound
        cand, last = hi, None
        for _ in range(50):
            if hi - lo <= 1e-9 * hi:
                break
            need = rem / (cand * e_iso - since)  # steps/s each job needs to finish by rho = cand
            x_c = np.clip(_max_min(self, thr / need[:, None], sf, inp.gpus), 0.0, 1.0)
            lam = float(((thr * x_c).sum(axis=1) / need).min())
            if lam >= 1.0:
                x, hi = x_c, min(cand, rho_of(x_c))
            else:
                lo = max(lo, cand)
            # lambda is close to linear in rho while the bottleneck jobs stay the same: secant to lambda = 1,
            # kept inside the bracket (bisection otherwise)
            nxt = hi if last is None else cand + (1.0 - lam) * (cand - last[0]) / (lam - last[1]) \
                if lam != last[1] else 0.5 * (lo + hi)
            last = (cand, lam)
            cand = nxt if lo < nxt <= hi else 0.5 * (lo + hi)
            if cand == last[0]:
                cand = 0.5 * (lo + hi)
        else:
            self._count("ftf_not_converged", "finish-time fairness: rho not within 1e-9 after 50 LPs")
        return x


@dataclass
class MinTotalDurationPerf(GavelPolicy):
    """The allocation that lets every job finish soonest (Gavel's ``min_total_duration_perf``).

    Gavel bisects on the horizon T (from [100 s, 10^6 s], stopping within 5%, growing the range tenfold
    while nothing is feasible) with a feasibility program per T; its answer is the allocation at the last
    feasible T of that search, not at the optimum. T is feasible exactly when T >= 1 / lambda*, where
    lambda* = max min_i throughput_i / remaining_i is one LP; the bisection is replayed on that test, and
    the allocation comes from the feasibility LP at Gavel's final T.
    """

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr, sf, rem = inp.throughputs, inp.scale_factors, inp.steps_remaining
        x = np.clip(_max_min(self, thr / rem[:, None], sf, inp.gpus), 0.0, 1.0)
        lam = float(((thr * x).sum(axis=1) / rem).min())
        t_star = 1.0 / lam if lam > 0 else float("inf")
        max_t, min_t, last_max, feasible_t = 1_000_000.0, 100.0, 1_000_000.0, None
        while feasible_t is None:
            if last_max > 1e30:
                raise ValueError("min-total-duration: no horizon is feasible (a job with no throughput?)")
            while 1.05 * min_t < max_t:
                t = (min_t + max_t) / 2.0
                if t >= t_star:
                    feasible_t, max_t = t, t
                else:
                    min_t = t
            max_t, min_t, last_max = last_max * 10.0, last_max, last_max * 10.0
        m, n = thr.shape
        rows = _base_rows(m, n, sf, inp.gpus)
        for i in range(m):
            rows.add(np.arange(i * n, i * n + n), thr[i], float(rem[i] / feasible_t), float("inf"))
        v = _solve(self, m * n, np.zeros(m * n), np.zeros(m * n), np.full(m * n, np.inf), rows)
        return np.clip(v.reshape(m, n), 0.0, 1.0)


POLICIES: dict[str, str] = {
    "fifo": "FIFO: jobs in arrival order each get a whole GPU type (Gavel's stateful FIFO)",
    "max-min-fairness": "LAS: max-min fairness of GPU time, heterogeneity-agnostic",
    "max-min-fairness-perf": "max-min fairness of throughput relative to an equal share (heterogeneity-aware LAS)",
    "finish-time-fairness-perf": "minimise the worst finish-time ratio rho (Themis's metric, heterogeneity-aware)",
    "min-total-duration-perf": "finish all active jobs as soon as possible (makespan)",
    "max-sum-throughput-perf": "maximise total throughput",
}
"""Gavel's policies this package runs, by Gavel's names with hyphens."""


def make_policy(name: str, seed: int = 0) -> GavelPolicy:
    """A fresh policy object for one run (policies keep per-run state: FIFO's queue, FTF's progress)."""
    if name == "fifo":
        return FifoPolicy(name=name, heterogeneity_aware=False, skip_zero_priority=True, seed=seed)
    if name == "max-min-fairness":
        return MaxMinFairnessPerf(name=name, heterogeneity_aware=False, agnostic=True)
    if name == "max-min-fairness-perf":
        return MaxMinFairnessPerf(name=name)
    if name == "finish-time-fairness-perf":
        return FinishTimeFairnessPerf(name=name)
    if name == "min-total-duration-perf":
        return MinTotalDurationPerf(name=name)
    if name == "max-sum-throughput-perf":
        return MaxSumThroughputPerf(name=name)
    raise KeyError(f"unknown Gavel policy {name!r}; known: {', '.join(POLICIES)}")
