"""The linear programs Gavel's policies solve, and how they are solved (HiGHS, one object per method per run).

Every program here has the same shape: the allocation x (m jobs x n types, row-major), optionally one more
column (t), Gavel's base rows (per type ``sum_i sf_i x_ij <= GPUs``, per job ``sum_j x_ij <= 1``) and at most
one more row per job over that job's x entries (and t). ``lp_program`` builds it column-wise in a few numpy
calls and hands it to HiGHS in one ``passModel`` (no per-row Python loop); each policy keeps one HiGHS
object per method for the whole run, so a solve costs the solve.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import GavelPolicy

if TYPE_CHECKING:
    import highspy
    import numpy as np


def lp_program(coef: np.ndarray | None, sf: np.ndarray, gpus: np.ndarray, *, t_coef: np.ndarray | None = None,
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
    """``lp_program``'s column starts and row indices, which depend only on the shape (cached: a run builds a
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


def max_min_allocation(policy: GavelPolicy, coef: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """max t s.t. t <= sum_j coef_ij x_ij for every job i, under the base constraints; returns x."""
    import numpy as np

    m, n = coef.shape
    v = solve_ipm(policy, lp_program(coef, sf, gpus, t_coef=-np.ones(m), lo=np.zeros(m)))
    return v[:-1].reshape(m, n)


class MaxMinValue:
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
        self.h.passModel(lp_program(thr, sf, gpus, t_coef=-np.ones(m), lo=np.zeros(m)))

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



def isolated(thr: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """Each job's throughput on a 1/m share of every type (Gavel's ``IsolatedPolicy``): the reference
    finish-time fairness compares against."""
    import numpy as np

    m = len(thr)
    x = np.tile(gpus / m, (m, 1)) / sf[:, None]
    x = x / np.maximum(x.sum(axis=1), 1.0)[:, None]
    return (thr * x).sum(axis=1)



def infeasible_status() -> highspy.HighsModelStatus:
    import highspy

    return highspy.HighsModelStatus.kInfeasible
