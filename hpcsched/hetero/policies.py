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
method) returns. HiGHS's interior point (no crossover) also returns a point inside the optimal face, not
a vertex; searches that need only an optimum's value (finish-time fairness's rho) use warm-started
simplex solves instead, and only the allocation the mechanism receives comes from the interior point.
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import highspy
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
    prices: np.ndarray | None = None  # $ per GPU-hour per type (min cost); None: every type costs 1
    slo_left: np.ndarray | None = None  # s until each job's deadline (inf: none); min cost's SLOs
    entities: tuple[str | None, ...] = ()  # each job's user or project (hierarchical fairness)
    # space sharing: co-located pairs (ids, smaller first, sorted) and their steps/s, pairs x types x 2
    # (each member's rate while it shares the GPU(s) with the other); empty unless the policy shares space
    pairs: tuple[tuple[int, int], ...] = ()
    pair_throughputs: np.ndarray | None = None


@dataclass
class GavelPolicy:
    """Base: a name, how the mechanism treats it, and counters of solver trouble (reported per run)."""

    name: str = ""
    heterogeneity_aware: bool = True  # False: the mechanism shuffles the type order every round (as Gavel)
    skip_zero_priority: bool = False
    space_sharing: bool = False  # True: allocate() also rows for ``inp.pairs`` (after the single jobs)
    stats: dict[str, int] = field(default_factory=dict)
    _solvers: dict[str, highspy.Highs] = field(default_factory=dict, init=False, repr=False, compare=False)
    _answers: dict[tuple, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        raise NotImplementedError

    def _memo(self, inp: AllocationInput, solve: Callable[[], np.ndarray], program: tuple | None = None,
              ) -> np.ndarray:
        """``solve()``, or its earlier answer when the same jobs (throughputs, sizes, weights) on the same GPUs
        were allocated before in this run. For policies whose program depends on nothing else. ``program``:
        instead, the arrays the program is built from (the same arrays, the same program), a coarser key.

        Why: the mechanism re-allocates whenever a job arrives or ends, and a run comes back to a set of
        jobs it already solved for (a job arrives, another leaves: ~10% of Gavel's traces' allocations).
        The interior point is a deterministic function of the program, so the answer is the same.
        """
        key = (inp.throughputs.tobytes(), inp.scale_factors.tobytes(), inp.priority_weights.tobytes(),
               inp.gpus.tobytes(), inp.throughputs.shape, inp.pairs,
               inp.pair_throughputs.tobytes() if inp.pair_throughputs is not None else b"") if program is None \
            else tuple((a.tobytes(), a.shape) for a in program)
        x = self._answers.get(key)
        if x is None:
            x = solve()
            if len(self._answers) >= 512:  # bound the memory of a long run: forget the oldest
                del self._answers[next(iter(self._answers))]
            self._answers[key] = x
        else:
            self._count("lp_reused")
        return x.copy()

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
#
# Every program here has the same shape: the allocation x (m jobs x n types, row-major), optionally one more
# column (t), Gavel's base rows (per type ``sum_i sf_i x_ij <= GPUs``, per job ``sum_j x_ij <= 1``) and at most
# one more row per job over that job's x entries (and t). ``_program`` builds it column-wise in a few numpy
# calls and hands it to HiGHS in one ``passModel`` (no per-row Python loop); each policy keeps one HiGHS
# object per method for the whole run, so a solve costs the solve.


def _program(coef: np.ndarray | None, sf: np.ndarray, gpus: np.ndarray, *, t_coef: np.ndarray | None = None,
             lo: np.ndarray | None = None, hi: np.ndarray | None = None, cost: np.ndarray | None = None,
             ) -> highspy.HighsLp:
    """The HiGHS model of a program over x (and t when ``t_coef`` is given), built column by column.

    Rows: n type rows, m job rows, then (when ``coef`` is given) m rows ``lo_i <= sum_j coef_ij x_ij +
    t_coef_i t <= hi_i``. ``cost`` is the objective to minimise (default: -t, i.e. maximise t). The row and
    column order is the one the programs were first written in, so HiGHS's interior point is unchanged.
    """
    import highspy
    import numpy as np

    m, n = sf.shape[0], gpus.shape[0]
    has_t = t_coef is not None
    nx = m * n
    nv = nx + (1 if has_t else 0)
    inf = highspy.kHighsInf
    k = 3 if coef is not None else 2  # entries per x column
    val = np.empty((m, n, k))
    val[:, :, 0] = sf[:, None]
    val[:, :, 1] = 1.0
    if coef is not None:
        val[:, :, 2] = coef
    starts, index = _structure(m, n, k, has_t)
    value = val.ravel().tolist()
    if has_t:
        value += t_coef.tolist()
    # HighsLp's fields are std::vectors: pybind11 fills them from a list several times faster than from a numpy
    # array (it converts element by element either way); the values are the same doubles
    lp = highspy.HighsLp()
    lp.num_col_ = nv
    lp.num_row_ = n + m + (m if coef is not None else 0)
    if cost is None:
        cost = [0.0] * nv
        if has_t:
            cost[-1] = -1.0
    lp.col_cost_ = cost.tolist() if isinstance(cost, np.ndarray) else cost
    lower = [0.0] * nv
    if has_t:
        lower[-1] = -inf
    lp.col_lower_ = lower
    lp.col_upper_ = [inf] * nv
    row_lo = [-inf] * (n + m)
    row_hi = np.asarray(gpus, dtype=float).tolist() + [1.0] * m
    if coef is not None:
        row_lo += [-inf] * m if lo is None else np.where(np.isinf(lo), -inf, lo).tolist()
        row_hi += [inf] * m if hi is None else np.where(np.isinf(hi), inf, hi).tolist()
    lp.row_lower_ = row_lo
    lp.row_upper_ = row_hi
    a = lp.a_matrix_
    a.format_ = highspy.MatrixFormat.kColwise
    a.start_ = starts
    a.index_ = index
    a.value_ = value
    a.num_col_ = nv
    a.num_row_ = lp.num_row_
    return lp


@functools.lru_cache(maxsize=128)
def _structure(m: int, n: int, k: int, has_t: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``_program``'s column starts and row indices, which depend only on the shape (cached: a run builds a
    program of the same shape many times). Per x column (job i, type j): type row j, job row n + i and, with
    k = 3, row n + m + i; then t's column over the last m rows. Tuples: the cached answer cannot be changed."""
    import numpy as np

    idx = np.empty((m, n, k), dtype=np.int64)
    idx[:, :, 0] = np.arange(n)[None, :]
    idx[:, :, 1] = (n + np.arange(m))[:, None]
    if k == 3:
        idx[:, :, 2] = (n + m + np.arange(m))[:, None]
    index = idx.ravel().tolist()
    starts = list(range(0, k * m * n + 1, k))
    if has_t:
        index += range(n + m, n + 2 * m)
        starts.append(k * m * n + m)
    return tuple(starts), tuple(index)


def highs_solver(policy: GavelPolicy, method: str) -> highspy.Highs:
    """The policy's HiGHS object for ``method`` ('ipm': interior point, no crossover; 'simplex'), made once."""
    h = policy._solvers.get(method)
    if h is None:
        from hpcsched.solvers.highs import new_highs

        h = new_highs()
        h.setOptionValue("presolve", "off")
        if method == "ipm":
            h.setOptionValue("solver", "ipm")
            h.setOptionValue("run_crossover", "off")
        else:
            h.setOptionValue("solver", "simplex")
        policy._solvers[method] = h
    return h


def run_lp(policy: GavelPolicy, h: highspy.Highs, what: str) -> np.ndarray:
    """Solve the model in ``h``; a status other than optimal is counted and said once; returns the columns."""
    import highspy
    import numpy as np

    from hpcsched.solvers.highs import run

    status = run(h)
    policy._count("lp_solves")
    if status != highspy.HighsModelStatus.kOptimal:
        policy._count("lp_not_optimal", f"HiGHS ({what}) returned {h.modelStatusToString(status)}; its last point "
                                        "is used, as Gavel uses ECOS's")
    return np.asarray(h.getSolution().col_value)


def solve_ipm(policy: GavelPolicy, lp: highspy.HighsLp) -> np.ndarray:
    """Solve ``lp`` with HiGHS's interior-point method, crossover off; returns the columns.

    Why interior point without crossover: among equally optimal allocations it returns one inside the
    optimal face, as Gavel's ECOS does, rather than a vertex (which starves every job it can; the round
    mechanism then runs a different schedule).
    """
    h = highs_solver(policy, "ipm")
    h.passModel(lp)
    return run_lp(policy, h, "interior point")


def _max_min(policy: GavelPolicy, coef: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """max t s.t. t <= sum_j coef_ij x_ij for every job i, under the base constraints; returns x."""
    import numpy as np

    m, n = coef.shape
    v = solve_ipm(policy, _program(coef, sf, gpus, t_coef=-np.ones(m), lo=np.zeros(m)))
    return v[:-1].reshape(m, n)


class _MaxMinValue:
    """``max_x min_i sum_j thr_ij x_ij / need_i`` for one set of jobs and many ``need`` vectors, by warm simplex.

    Why: finish-time fairness and minimum total duration search over such values (only the value, not the
    allocation, steers the search), and between two calls only the ``need`` column changes, so HiGHS's
    simplex restarts from the previous basis instead of solving afresh. The value is the optimum's,
    whichever method finds it; the allocation the mechanism uses still comes from the interior point.
    """

    def __init__(self, policy: GavelPolicy, thr: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> None:
        import numpy as np

        self.policy, self.thr = policy, thr
        m, n = thr.shape
        self.m, self.t_col = m, m * n
        self.rows = np.arange(n + m, n + 2 * m, dtype=np.int32)
        self.h = highs_solver(policy, "simplex")
        self.h.passModel(_program(thr, sf, gpus, t_coef=-np.ones(m), lo=np.zeros(m)))

    def __call__(self, need: np.ndarray) -> tuple[float, np.ndarray]:
        """(lambda, x) for rows ``sum_j thr_ij x_ij - need_i t >= 0``, max t; lambda computed from x."""
        import numpy as np

        for r, c in zip(self.rows.tolist(), need.tolist(), strict=True):
            self.h.changeCoeff(r, self.t_col, -c)
        v = run_lp(self.policy, self.h, "simplex")
        x = np.clip(v[:-1].reshape(self.m, -1), 0.0, 1.0)
        return float(((self.thr * x).sum(axis=1) / need).min()), x


def proportional(thr: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """Each job's throughput on an equal share of every type (Gavel's ``ProportionalPolicy``)."""
    return (thr * (gpus / gpus.sum())).sum(axis=1)


@dataclass
class MaxMinFairnessPerf(GavelPolicy):
    """Heterogeneity-aware max-min fairness (Gavel's ``max_min_fairness_perf``)."""

    agnostic: bool = False  # every throughput 1: Gavel's ``max_min_fairness`` (LAS)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.ones_like(inp.throughputs) if self.agnostic else inp.throughputs
        coef = thr / (inp.priority_weights * proportional(thr, inp.gpus))[:, None] * inp.scale_factors[:, None]
        # keyed by the program itself: the agnostic policy's depends only on sizes and weights, and comes back
        # far more often than a set of jobs does (A: 149 programs in 209 allocations)
        return self._memo(inp, lambda: np.clip(_max_min(self, coef, inp.scale_factors, inp.gpus), 0.0, 1.0),
                          program=(coef, inp.scale_factors, inp.gpus))


@dataclass
class MaxMinFairnessPacked(GavelPolicy):
    """Max-min fairness with space sharing (Gavel's ``max_min_fairness_packed``, ``MaxMinFairnessPolicyWithPacking``).

    Why a program over combinations: two jobs sharing a GPU each run slower than alone, but together they can
    do more than either; the program decides how much time each job gets alone and in each pair. Variables
    ``x_cj`` for every combination c (the m single jobs, then the pairs) and type j; per type
    ``sum_c sf_c x_cj <= GPUs`` (a pair holds ``sf`` GPUs once); per job, the time of all its combinations
    ``<= 1``; maximise ``t`` with ``t <= sum_{c containing i} sum_j sf T_icj x_cj / (w_i P_i)``, where
    ``T_icj`` is job i's rate in c on j and ``P_i`` its rate on an equal share of every type (from its
    isolated rates). Gavel holds the rates in a float32 matrix divided by the weight there; so do we.
    Returns (m + pairs) x types, the pairs' rows after the jobs' in ``inp.pairs`` order.
    """

    space_sharing: bool = True

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        def solve() -> np.ndarray:
            m, n = inp.throughputs.shape
            pairs = inp.pairs
            pthr = inp.pair_throughputs if inp.pair_throughputs is not None else np.zeros((0, n, 2))
            if len(pairs) != pthr.shape[0]:
                raise ValueError(f"{len(pairs)} pairs but {pthr.shape[0]} rows of pair throughputs")
            w32 = inp.priority_weights.astype(np.float32)
            norm = inp.scale_factors / proportional(inp.throughputs, inp.gpus)  # sf_i / P_i
            single = (inp.throughputs.astype(np.float32) / w32[:, None]).astype(float) * norm[:, None]
            row = {jid: r for r, jid in enumerate(inp.job_ids)}
            members = [(row[a], row[b]) for a, b in pairs]
            pair_coef = np.empty((len(pairs), n, 2))
            for p, (ra, rb) in enumerate(members):
                pair_coef[p, :, 0] = (pthr[p, :, 0].astype(np.float32) / w32[ra]).astype(float) * norm[ra]
                pair_coef[p, :, 1] = (pthr[p, :, 1].astype(np.float32) / w32[rb]).astype(float) * norm[rb]
            sf_pair = np.array([inp.scale_factors[ra] for ra, _ in members], dtype=float)
            x = solve_ipm(self, packed_program(single, pair_coef, members, inp.scale_factors, sf_pair, inp.gpus))
            return np.clip(x[:-1].reshape(m + len(pairs), n), 0.0, 1.0)

        return self._memo(inp, solve)


def packed_program(single: np.ndarray, pair_coef: np.ndarray, members: list[tuple[int, int]], sf: np.ndarray,
                    sf_pair: np.ndarray, gpus: np.ndarray) -> highspy.HighsLp:
    """The space-sharing max-min LP, column-wise: x (singles then pairs, row-major over types), then t.

    Rows: n type rows (``sum sf x <= GPUs``), m job rows (``sum of the job's combinations <= 1``), m objective
    rows (``sum coef x - t >= 0``). A pair's column enters both members' job and objective rows.
    """
    import highspy
    import numpy as np

    m, n = single.shape
    inf = highspy.kHighsInf
    index: list[int] = []
    value: list[float] = []
    starts = [0]
    for i in range(m):
        for j in range(n):
            index += [j, n + i, n + m + i]
            value += [float(sf[i]), 1.0, float(single[i, j])]
            starts.append(len(index))
    for p, (a, b) in enumerate(members):
        lo, hi = (a, b) if a < b else (b, a)  # row indices ascending within a column
        clo, chi = (pair_coef[p, :, 0], pair_coef[p, :, 1]) if a < b else (pair_coef[p, :, 1], pair_coef[p, :, 0])
        for j in range(n):
            index += [j, n + lo, n + hi, n + m + lo, n + m + hi]
            value += [float(sf_pair[p]), 1.0, 1.0, float(clo[j]), float(chi[j])]
            starts.append(len(index))
    index += list(range(n + m, n + 2 * m))
    value += [-1.0] * m
    starts.append(len(index))
    nv = (m + len(members)) * n + 1
    lp = highspy.HighsLp()
    lp.num_col_ = nv
    lp.num_row_ = n + 2 * m
    cost = np.zeros(nv)
    cost[-1] = -1.0
    lp.col_cost_ = cost
    lower = np.zeros(nv)
    lower[-1] = -inf
    lp.col_lower_ = lower
    lp.col_upper_ = np.full(nv, inf)
    lp.row_lower_ = np.concatenate([np.full(n + m, -inf), np.zeros(m)])
    lp.row_upper_ = np.concatenate([np.asarray(gpus, dtype=float), np.ones(m), np.full(m, inf)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts  # lists: pybind11 fills HighsLp's vectors faster from them than from arrays
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.a_matrix_.num_col_ = nv
    lp.a_matrix_.num_row_ = lp.num_row_
    return lp


@dataclass
class MaxSumThroughputPerf(GavelPolicy):
    """Maximise the summed throughput (steps/s) of all jobs (Gavel's ``max_sum_throughput_perf``)."""

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        m, n = inp.throughputs.shape

        def solve() -> np.ndarray:
            v = solve_ipm(self, _program(None, inp.scale_factors, inp.gpus, cost=-inp.throughputs.ravel()))
            return np.clip(v.reshape(m, n), 0.0, 1.0)

        return self._memo(inp, solve)


def isolated(thr: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
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

    def isolated_finish(self, inp: AllocationInput, iso: np.ndarray) -> np.ndarray:
        """Each job's finish time on its isolated share ``iso`` (steps/s): the progress since the previous call
        counted at the isolated speed it had then (Gavel keeps this sum across calls), plus what remains at
        today's. Called once per allocation: it advances the bookkeeping."""
        import numpy as np

        rem = inp.steps_remaining
        for r, j in enumerate(inp.job_ids):
            c = self._cum_iso.setdefault(j, 0.0)
            if j in self._prev_rem:
                self._cum_iso[j] = c + (self._prev_rem[j] - rem[r]) / self._prev_iso[j]
        e_iso = np.array([self._cum_iso[j] for j in inp.job_ids]) + rem / iso
        self._prev_rem = dict(zip(inp.job_ids, rem, strict=True))
        self._prev_iso = dict(zip(inp.job_ids, iso, strict=True))
        return e_iso

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr, sf, rem, since = inp.throughputs, inp.scale_factors, inp.steps_remaining, inp.times_since_start
        iso = isolated(thr, sf, inp.gpus)
        e_iso = self.isolated_finish(inp, iso)

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
        feasible = None
        if hi - lo > 1e-9 * hi:
            feasible = self._search(_MaxMinValue(self, thr, sf, inp.gpus), rem, since, e_iso, lo, hi)
        if feasible is not None:  # the allocation: the interior point at the last feasible rho
            x = np.clip(_max_min(self, thr / feasible[:, None], sf, inp.gpus), 0.0, 1.0)
        return x

    def _search(self, value: _MaxMinValue, rem: np.ndarray, since: np.ndarray, e_iso: np.ndarray, lo: float,
                hi: float) -> np.ndarray | None:
        """The steps/s each job needs at the smallest rho (to 1e-9) with lambda(rho) >= 1, or None.

        lambda(rho) (how far the needs at rho can be exceeded) is increasing, smooth between kinks where
        the binding jobs change. The root is bracketed by ``lo`` (infeasible) and ``hi`` (feasible) and
        found by regula falsi with the Illinois rule (an end kept twice has its value halved, so kinks
        cannot stall it): superlinear, 3-6 LPs where plain bisection needs 30.
        """
        def f(rho: float) -> tuple[float, np.ndarray]:
            need = rem / (rho * e_iso - since)  # steps/s each job needs to finish by rho
            return value(need)[0] - 1.0, need

        f_hi, feasible = f(hi)
        if f_hi < 0:  # the isolated share itself only within the solver's tolerance: keep it
            return None
        # lo is often rho* itself (the worst job alone on its best type): try just above it first
        probe = lo * (1.0 + 5e-10)
        if (probe * e_iso - since).min() > 0:
            f_lo, need = f(probe)
            if f_lo >= 0:
                return need
            lo = probe
        else:
            f_lo = -1.0
        side = 0
        for _ in range(60):
            if hi - lo <= 1e-9 * hi:
                return feasible
            cand = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
            if not lo < cand < hi:
                cand = 0.5 * (lo + hi)
            f_c, need = f(cand)
            if f_c >= 0:
                hi, f_hi, feasible = cand, f_c, need
                if f_c <= 1e-9:  # lambda = 1 to 1e-9: rho* to about as much (lambda's slope is ~1 / rho)
                    return feasible
                if side == 1:
                    f_lo *= 0.5
                side = 1
            else:
                lo, f_lo = cand, f_c
                if side == -1:
                    f_hi *= 0.5
                side = -1
        self._count("ftf_not_converged", "finish-time fairness: rho not within 1e-9 after 60 LPs")
        return feasible


def gavel_horizon(t_star: float) -> float:
    """The horizon T Gavel's min-total-duration bisection stops at, given the smallest feasible one ``t_star``.

    Gavel bisects [100 s, 10^6 s] until the ends are within 5% (growing the range tenfold while nothing is
    feasible) and keeps the last feasible T, not ``t_star``; its allocation is the feasibility program's at
    that T. Raises ValueError when no horizon is feasible (a job with no throughput).
    """
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
    return feasible_t


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
        # lambda* from the interior point, not a simplex: Gavel's bisection compares T with 1 / lambda*, and a
        # T within the interior point's tolerance of it flips (A4's average JCT moves by 1%)
        lam = float(((thr * x).sum(axis=1) / rem).min())
        feasible_t = gavel_horizon(1.0 / lam if lam > 0 else float("inf"))
        m, n = thr.shape
        v = solve_ipm(self, _program(thr, sf, inp.gpus, lo=rem / feasible_t, cost=np.zeros(m * n)))
        return np.clip(v.reshape(m, n), 0.0, 1.0)


@dataclass
class MinCostPerf(GavelPolicy):
    """Most throughput per dollar: maximise ``sum_ij T_ij x_ij / price_j`` (Gavel's
    ``max_sum_throughput_normalized_by_cost_perf``; with ``slos``, its ``..._perf_SLOs``).

    With SLOs every job with a deadline must also get ``sum_j T_ij x_ij >= remaining steps / seconds left``;
    when no allocation meets them all, Gavel drops the SLO rows and solves again (counted here as
    ``slo_infeasible`` and said once). A type without a price costs 1, as in Gavel without a price file.
    """

    slos: bool = False

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = inp.throughputs
        m, n = thr.shape
        price = np.ones(n) if inp.prices is None else inp.prices
        cost = -(thr / price[None, :]).ravel()
        if self.slos and inp.slo_left is not None and np.isfinite(inp.slo_left).any():
            with np.errstate(divide="ignore"):
                need = np.where(np.isfinite(inp.slo_left), inp.steps_remaining / inp.slo_left, -np.inf)
            need = np.where(inp.slo_left > 0, need, -np.inf)  # a deadline already past: Gavel's row is void
            v = solve_ipm(self, _program(thr, inp.scale_factors, inp.gpus, lo=need, cost=cost))
            if self._solvers["ipm"].getModelStatus() == _infeasible():
                self._count("slo_infeasible", "min cost: no allocation meets every SLO; solved without them, "
                                              "as Gavel does")
            else:
                return np.clip(v.reshape(m, n), 0.0, 1.0)
        v = solve_ipm(self, _program(None, inp.scale_factors, inp.gpus, cost=cost))
        return np.clip(v.reshape(m, n), 0.0, 1.0)


def _infeasible() -> highspy.HighsModelStatus:
    import highspy

    return highspy.HighsModelStatus.kInfeasible


@dataclass
class WaterFilling(GavelPolicy):
    """Max-min fairness by water filling, optionally hierarchical (Gavel's ``max_min_fairness_water_filling``
    and ``..._perf``; with ``entity_weights``, its hierarchical policy with the 'fairness' reweighting).

    Plain max-min fairness fixes only the worst job's share; water filling keeps raising the others: it
    solves the weighted max-min program, freezes the jobs that cannot get more without taking from a
    frozen one (the bottlenecks), and repeats on the rest, each job never below the level it reached.
    Normalised throughput is ``sum_j T_ij x_ij / P_i`` (P_i: the job's throughput on an equal share of every
    type; all throughputs 1 when agnostic). Bottlenecks are found as Gavel finds them, by a MILP that
    makes as many unfrozen jobs as possible exceed ``1.0001 x`` their level (by 1e-5); a job it cannot
    lift is frozen.

    Hierarchical: each entity (user or project, ``AllocationInput.entities``) has a weight; its unfrozen
    jobs share it in proportion to their own priority weights, so an entity's share does not grow with
    its number of jobs. Jobs with no entity, or an entity with no weight, keep their own weight.
    """

    agnostic: bool = False
    entity_weights: dict[str, float] = field(default_factory=dict)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.ones_like(inp.throughputs) if self.agnostic else inp.throughputs
        sf, gpus, m = inp.scale_factors, inp.gpus, len(inp.job_ids)
        prop = proportional(thr, gpus)
        norm = thr / prop[:, None]  # normalised throughput per unit of x
        level = np.zeros(m)  # each job's normalised throughput reached so far
        frozen = np.zeros(m, dtype=bool)
        x = np.zeros_like(thr)
        big = float(np.max(norm * sf[:, None])) if m else 0.0  # Gavel's M
        for _ in range(m):
            w = self._weights(inp, frozen)
            live = ~frozen & (w > 0)
            if not live.any():
                break
            x_new, t = self._raise(norm, sf, gpus, level, frozen, w, live)
            if x_new is None:
                break
            x = x_new
            level = np.where(live, level + t * w / sf, level)
            liftable = self._liftable(norm, sf, gpus, level, frozen | ~live, big)
            newly = live & ~liftable
            if not newly.any():
                break
            frozen |= newly
            if frozen.all():
                break
        return np.clip(x, 0.0, 1.0)

    def _weights(self, inp: AllocationInput, frozen: np.ndarray) -> np.ndarray:
        """Each job's weight this round: its own, or its entity's weight shared by the entity's unfrozen jobs."""
        import numpy as np

        w = np.array(inp.priority_weights, dtype=float)
        if not self.entity_weights or not inp.entities:
            return np.where(frozen, 0.0, w)
        out = np.where(frozen, 0.0, w)
        for e, ew in self.entity_weights.items():
            members = np.array([x == e for x in inp.entities]) & ~frozen
            total = w[members].sum()
            if total > 0:
                out[members] = ew * w[members] / total
        return out

    def _raise(self, norm: np.ndarray, sf: np.ndarray, gpus: np.ndarray, level: np.ndarray, frozen: np.ndarray,
               w: np.ndarray, live: np.ndarray) -> tuple[np.ndarray | None, float]:
        """max t: every live job's ``sf_i / w_i (normalised throughput - level_i) >= t``, every job >= its level."""
        import numpy as np

        m, n = norm.shape
        mult = np.where(live, sf / np.where(live, w, 1.0), 0.0)  # Gavel's: a larger weight, a larger raise
        # rows: sum_j norm_ij x_ij - t / mult_i >= level_i for live jobs; >= level_i (no t) for the others
        t_coef = np.where(live, -1.0 / np.where(live, mult, 1.0), 0.0)
        v = solve_ipm(self, _program(norm, sf, gpus, t_coef=t_coef, lo=level))
        h = self._solvers["ipm"]
        if h.getModelStatus() == _infeasible():
            return None, 0.0
        return v[:-1].reshape(m, n), float(max(v[-1], 0.0))

    def _liftable(self, norm: np.ndarray, sf: np.ndarray, gpus: np.ndarray, level: np.ndarray,
                  fixed: np.ndarray, big: float) -> np.ndarray:
        """Which jobs can exceed 1.0001 x their level together, every job kept at its level (Gavel's MILP)."""
        import highspy
        import numpy as np

        from hpcsched.solvers.highs import new_highs, run

        m, n = norm.shape
        nx = m * n
        slack, eps = 1.0001, 1e-5
        # columns: x (m x n), z (m, binary); maximise sum z. Rows: base; y_i >= level_i; Gavel's big-M pair:
        # y_i - big z_i <= slack level_i - eps (z_i = 0 keeps y_i at its level) and y_i - big z_i >= slack
        # level_i - big (z_i = 1 needs y_i >= slack level_i).
        lp = _program(norm, sf, gpus, lo=level, cost=np.zeros(nx))
        h = new_highs()
        h.passModel(lp)
        inf = highspy.kHighsInf
        h.addVars(m, np.zeros(m), np.where(fixed, 0.0, 1.0))
        h.changeColsCost(m, np.arange(nx, nx + m, dtype=np.int32), -np.ones(m))
        h.changeColsIntegrality(m, np.arange(nx, nx + m, dtype=np.int32),
                                np.full(m, highspy.HighsVarType.kInteger))
        for i in range(m):
            cols = np.append(np.arange(i * n, i * n + n), nx + i).astype(np.int32)
            # y_i - slack level_i + eps <= big z_i
            h.addRow(-inf, slack * level[i] - eps, n + 1, cols, np.append(norm[i], -big))
            # slack level_i - y_i <= big (1 - z_i)  <=>  y_i - big z_i >= slack level_i - big
            h.addRow(slack * level[i] - big, inf, n + 1, cols, np.append(norm[i], -big))
        status = run(h)
        self._count("milp_solves")
        if status != highspy.HighsModelStatus.kOptimal:
            self._count("milp_not_optimal", f"water filling: the bottleneck MILP returned "
                                            f"{h.modelStatusToString(status)}; every job is taken as a bottleneck")
            return np.zeros(m, dtype=bool)
        z = np.asarray(h.getSolution().col_value)[nx:]
        return z > 0.5


POLICIES: dict[str, str] = {
    "fifo": "FIFO: jobs in arrival order each get a whole GPU type (Gavel's stateful FIFO)",
    "max-min-fairness": "LAS: max-min fairness of GPU time, heterogeneity-agnostic",
    "max-min-fairness-perf": "max-min fairness of throughput relative to an equal share (heterogeneity-aware LAS)",
    "finish-time-fairness-perf": "minimise the worst finish-time ratio rho (Themis's metric, heterogeneity-aware)",
    "min-total-duration-perf": "finish all active jobs as soon as possible (makespan)",
    "max-sum-throughput-perf": "maximise total throughput",
    "max-min-fairness-packed": "heterogeneity-aware max-min fairness with space sharing (pairs of jobs of equal "
                               "size co-located on a GPU type, at the pair rates of the throughput table)",
    # Gavel's other space-sharing variants (hetero/packed_policies.py)
    "fifo-packed": "FIFO with space sharing: queued jobs packed onto placed jobs of equal size when the pair "
                   "runs > 1.5x their normalised rates",
    "finish-time-fairness-packed": "finish-time fairness (worst rho) with space sharing",
    "min-total-duration-packed": "finish all active jobs as soon as possible, with space sharing",
    "max-sum-throughput-normalized-by-cost-packed-SLOs": "minimum cost with space sharing and SLOs (without "
                                                         "prices or SLOs: packed max-sum throughput)",
    "max-sum-throughput-normalized-by-cost-perf": "minimum cost: maximise throughput per dollar (prices: "
                                                  "type=count@$/h)",
    "max-sum-throughput-normalized-by-cost-perf-SLOs": "minimum cost, every job finishing by its SLO when "
                                                       "possible",
    "max-min-fairness-water-filling": "max-min fairness by water filling (every job raised as far as it can "
                                      "go), heterogeneity-agnostic",
    "max-min-fairness-water-filling-perf": "water-filling max-min fairness, heterogeneity-aware; hierarchical "
                                           "with entity weights",
}
"""Gavel's policies this package runs, by Gavel's names with hyphens."""


NO_SOLVER = ("fifo", "fifo-packed")
"""Policies that solve no program: the same with either ``solver``."""


def make_policy(name: str, seed: int = 0, *, entity_weights: dict[str, float] | None = None,
                solver: str = "highs") -> GavelPolicy:
    """A fresh policy object for one run (policies keep per-run state: FIFO's queue, FTF's progress).

    ``entity_weights`` ({user or project: weight}) makes the water-filling policies hierarchical.
    ``solver="ecos"``: Gavel's own programs solved with ECOS (``hpcsched.hetero.ecos_programs``, the ``cvxpy``
    extra), whose allocations are Gavel's; FIFO (packed too) needs no solver either way."""
    if solver == "ecos" and name not in NO_SOLVER:
        from hpcsched.hetero.ecos_programs import make_ecos_policy

        return make_ecos_policy(name)
    if solver not in ("highs", "ecos"):
        raise KeyError(f"unknown solver {solver!r}; known: highs, ecos")
    if name.startswith("max-min-fairness-water-filling") and name in POLICIES:
        return WaterFilling(name=name, heterogeneity_aware=name.endswith("-perf"),
                            agnostic=not name.endswith("-perf"), entity_weights=dict(entity_weights or {}))
    if name.endswith(("-packed", "-packed-SLOs")) and name in POLICIES and name != "max-min-fairness-packed":
        from hpcsched.hetero.packed_policies import make_packed_policy  # imports this module: not at the top

        return make_packed_policy(name)
    if name.startswith("max-sum-throughput-normalized-by-cost-perf") and name in POLICIES:
        return MinCostPerf(name=name, slos=name.endswith("-SLOs"))
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
    if name == "max-min-fairness-packed":
        return MaxMinFairnessPacked(name=name)
    raise KeyError(f"unknown Gavel policy {name!r}; known: {', '.join(POLICIES)}")
