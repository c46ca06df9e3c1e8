"""Gavel's other space-sharing ("packed") policies: FIFO, finish-time fairness, minimum total duration and
minimum cost over single jobs and co-located pairs.

Gavel (c4fa400, ``scheduler/policies``) has a packed variant of most of its policies; ``max_min.py`` has
``max-min-fairness-packed``, this module the others, read from Gavel's ``FIFOPolicyWithPacking``,
``FinishTimeFairnessPolicyWithPacking``, ``MinTotalDurationPolicyWithPacking`` and
``ThroughputNormalizedByCostSumWithPackingSLOs`` and written anew. They share the combination program of
``lp.packed_program`` (a variable per combination, i.e. each job alone and each pair of active jobs of
equal size, and per type; a pair holds its GPUs once; each job's alone and pair time sums to <= 1) and the
pair mechanism of ``hetero/packing.py``; only what is maximised differs. A job's throughput under an
allocation is ``y_i = sum over the combinations c holding i, sum_j T_icj x_cj`` (``T_icj``: its rate alone,
or its rate in the pair, from the throughput table). Gavel holds these rates in a float32 matrix (divided by
the priority weight where its policy passes the weights); so do we, since the figures follow them.

- ``fifo-packed``: no program. Every allocation starts afresh: jobs in arrival order each take the type
  where they run fastest among those with room; then the queued jobs, in order, are packed onto a placed
  job of the same size when the pair's summed normalised rate (each rate over the job's rate alone on that
  type) exceeds 1.5, onto the placed job where it is largest; the first queued job that packs with none ends
  the packing (FIFO's order is kept).
- ``finish-time-fairness-packed``: minimise the worst rho_i = (elapsed_i + remaining_i / y_i) / E_i (E_i: the
  job's finish time on its isolated share, progress so far counted at the isolated speed). For a fixed rho
  each job needs ``y_i >= remaining_i / (rho E_i - elapsed_i)``, a linear constraint, so rho* is found as the
  single-job policy finds it (its rho search, on the combination program) and the allocation is the max-min
  interior point at the last feasible rho.
- ``min-total-duration-packed``: Gavel bisects on the horizon T with a feasibility program ``y_i >=
  remaining_i / T``; T is feasible exactly when T >= 1 / lambda*, lambda* = max min_i y_i / remaining_i (one
  LP); Gavel's bisection is replayed on that test and the feasibility program solved at its final T.
- ``max-sum-throughput-normalized-by-cost-packed-SLOs``: maximise ``sum_i y_i`` with each rate divided by
  its type's price (1 without prices: then packed max-sum throughput), every job with an SLO also getting
  ``y_i >= remaining_i / seconds to its deadline``; when no allocation meets every SLO, solved without them
  (as Gavel does; counted as ``solver.slo_infeasible``).

Gavel's ``max_min_fairness_water_filling_packed`` is not here: its bottleneck search is a big-M MILP over the
combination program (Gavel needs GLPK_MI, absent from its venv here), so it could not be checked against Gavel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.finish_time import FinishTimeFairnessPerf
from hpcsched.hetero.policies.lp import highs_solver, infeasible_status, isolated, packed_program, run_lp, solve_ipm
from hpcsched.hetero.policies.min_total_duration import gavel_horizon
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import highspy
    import numpy as np


class Combinations:
    """The combination structure of one allocation input: the m single jobs, then ``inp.pairs``.

    ``single`` (m x n) and ``pair`` (pairs x n x 2, the smaller id's rate first) are the jobs' rates as Gavel's
    float32 matrix holds them (divided by the priority weight when ``weighted``); ``members`` the pairs' row
    indices. ``y(x)`` is each job's throughput under an allocation x ((m + pairs) x n).
    """

    def __init__(self, inp: AllocationInput, *, weighted: bool) -> None:
        import numpy as np

        m, n = inp.throughputs.shape
        pthr = inp.pair_throughputs if inp.pair_throughputs is not None else np.zeros((0, n, 2))
        if len(inp.pairs) != pthr.shape[0]:
            raise ValueError(f"{len(inp.pairs)} pairs but {pthr.shape[0]} rows of pair throughputs")
        w32 = inp.priority_weights.astype(np.float32) if weighted else np.ones(m, dtype=np.float32)
        row = {jid: r for r, jid in enumerate(inp.job_ids)}
        self.m, self.n = m, n
        self.members = [(row[a], row[b]) for a, b in inp.pairs]
        self.single = (inp.throughputs.astype(np.float32) / w32[:, None]).astype(float)
        self.pair = np.empty((len(self.members), n, 2))
        for p, (ra, rb) in enumerate(self.members):
            self.pair[p, :, 0] = (pthr[p, :, 0].astype(np.float32) / w32[ra]).astype(float)
            self.pair[p, :, 1] = (pthr[p, :, 1].astype(np.float32) / w32[rb]).astype(float)
        self.sf = inp.scale_factors
        self.sf_pair = np.array([inp.scale_factors[ra] for ra, _ in self.members], dtype=float)
        self.gpus = inp.gpus
        self.a = np.array([ra for ra, _ in self.members], dtype=int)
        self.b = np.array([rb for _, rb in self.members], dtype=int)

    @property
    def rows(self) -> int:
        return self.m + len(self.members)

    def y(self, x: np.ndarray) -> np.ndarray:
        """Each job's throughput (steps/s) under x: alone plus its share of every pair it is in."""
        import numpy as np

        out = (self.single * x[: self.m]).sum(axis=1)
        xp = x[self.m:]
        np.add.at(out, self.a, (self.pair[:, :, 0] * xp).sum(axis=1))
        np.add.at(out, self.b, (self.pair[:, :, 1] * xp).sum(axis=1))
        return out

    def program(self, scale: np.ndarray | None = None) -> highspy.HighsLp:
        """The max-min program ``max t, t <= y_i / scale_i`` (scale 1 when None) over the combinations."""
        import numpy as np

        s = np.ones(self.m) if scale is None else scale
        return packed_program(self.single / s[:, None], self._pair_coef(s), self.members, self.sf, self.sf_pair,
                              self.gpus)

    def _pair_coef(self, s: np.ndarray) -> np.ndarray:
        import numpy as np

        out = np.empty_like(self.pair)
        if len(self.members):
            out[:, :, 0] = self.pair[:, :, 0] / s[self.a, None]
            out[:, :, 1] = self.pair[:, :, 1] / s[self.b, None]
        return out

    def bounded(self, lo: np.ndarray, cost: np.ndarray | None = None) -> highspy.HighsLp:
        """The combination program with rows ``y_i >= lo_i`` (-inf: none) and objective ``cost`` (minimised;
        zero: a feasibility program), without a max-min variable (its column is fixed at 0)."""
        import highspy
        import numpy as np

        lp = packed_program(self.single, self.pair, self.members, self.sf, self.sf_pair, self.gpus)
        nv = lp.num_col_
        c = np.zeros(nv)
        if cost is not None:
            c[:-1] = cost
        lp.col_cost_ = c
        lower, upper = np.array(lp.col_lower_), np.array(lp.col_upper_)
        lower[-1] = upper[-1] = 0.0
        lp.col_lower_, lp.col_upper_ = lower, upper
        inf = highspy.kHighsInf
        row_lo = np.array(lp.row_lower_)
        row_lo[self.n + self.m:] = np.where(np.isfinite(lo), lo, -inf)
        lp.row_lower_ = row_lo
        return lp

    def alone(self, x_single: np.ndarray) -> np.ndarray:
        """An allocation of single jobs only (pairs get no time)."""
        import numpy as np

        return np.vstack([x_single, np.zeros((len(self.members), self.n))])


def _max_min(policy: GavelPolicy, comb: Combinations, scale: np.ndarray) -> np.ndarray:
    """The interior point of ``max t, t <= y_i / scale_i``: the combinations' allocation, clipped to [0, 1]."""
    import numpy as np

    v = solve_ipm(policy, comb.program(scale))
    return np.clip(v[:-1].reshape(comb.rows, comb.n), 0.0, 1.0)


class _PackedMaxMinValue:
    """``max_x min_i y_i / need_i`` for many ``need`` vectors, by warm-started simplex (only the t column's
    coefficients change between calls), as the single-job finish-time fairness search does."""

    def __init__(self, policy: GavelPolicy, comb: Combinations) -> None:
        import numpy as np

        self.policy, self.comb = policy, comb
        self.t_col = comb.rows * comb.n
        self.rows = np.arange(comb.n + comb.m, comb.n + 2 * comb.m, dtype=np.int32)
        self.h = highs_solver(policy, "simplex")
        self.h.passModel(comb.program())

    def __call__(self, need: np.ndarray) -> tuple[float, np.ndarray]:
        import numpy as np

        for r, c in zip(self.rows.tolist(), need.tolist(), strict=True):
            self.h.changeCoeff(r, self.t_col, -c)
        v = run_lp(self.policy, self.h, "simplex")
        x = np.clip(v[:-1].reshape(self.comb.rows, self.comb.n), 0.0, 1.0)
        return float((self.comb.y(x) / need).min()), x


@dataclass
class FifoPacked(GavelPolicy):
    """Gavel's FIFO with packing (``fifo_packed``, ``FIFOPolicyWithPacking``); see the module docstring.

    Unlike Gavel's plain FIFO this mode forgets its allocation on every call and picks each job's fastest type
    (not the left-over loop variable), so nothing is kept between calls.
    """

    space_sharing: bool = True
    skip_zero_priority: bool = True
    threshold: float = 1.5  # Gavel's packing_threshold: the summed normalised rate a pair must exceed

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        types = inp.types  # sorted by name, as Gavel sorts its available types
        sf = {j: int(s) for j, s in zip(inp.job_ids, inp.scale_factors, strict=True)}
        thr = {j: dict(zip(types, row, strict=True)) for j, row in zip(inp.job_ids, inp.throughputs, strict=True)}
        pthr = inp.pair_throughputs if inp.pair_throughputs is not None else np.zeros((0, len(types), 2))
        pair_rate = {pair: dict(zip(types, map(tuple, rates), strict=True))
                     for pair, rates in zip(inp.pairs, pthr, strict=True)}
        free = {t: int(g) for t, g in zip(types, inp.gpus, strict=True)}
        given: dict[tuple[int, ...], str] = {}  # insertion order matters: packing scans it
        queue = list(inp.job_ids)
        avail = [t for t in types if free[t] > 0]
        while queue and avail:
            j = queue.pop(0)
            fits = [t for t in avail if free[t] >= sf[j]]
            if not fits:
                break  # Gavel has already taken the job off the queue: it is not packed either
            best, best_thr = fits[0], -1.0
            for t in fits:  # the fastest type with room; ties: the first by name
                if thr[j][t] > best_thr:
                    best, best_thr = t, thr[j][t]
            if thr[j][best] > 0.0:
                given[(j,)] = best
                free[best] -= sf[j]
                if free[best] == 0:
                    avail.remove(best)
        while queue:  # pack the rest, in order, onto placed jobs of the same size
            j = queue.pop(0)
            best_score, partner = self.threshold, None
            for key, t in given.items():
                if len(key) == 2 or sf[key[0]] != sf[j]:
                    continue
                pair = (min(key[0], j), max(key[0], j))
                rates = pair_rate[pair][t]
                score = sum(r / thr[i][t] for i, r in zip(pair, rates, strict=True) if r > 0.0)
                if score > best_score:
                    best_score, partner = score, key
            if partner is None:
                break  # FIFO: no later job may jump ahead of one that packs with none
            t = given.pop(partner)
            given[(min(partner[0], j), max(partner[0], j))] = t
        keys = [(j,) for j in inp.job_ids] + list(inp.pairs)
        col = {t: c for c, t in enumerate(types)}
        x = np.zeros((len(keys), len(types)))
        for r, key in enumerate(keys):
            if key in given:
                x[r, col[given[key]]] = 1.0
        return x


@dataclass
class FinishTimeFairnessPacked(FinishTimeFairnessPerf):
    """Finish-time fairness with space sharing (Gavel's ``finish_time_fairness_packed``); module docstring.

    Reuses the single-job policy's progress bookkeeping and rho search (``_search``); only the program is the
    combinations'. Rates are divided by the priority weight, as Gavel's flatten does for this policy.
    """

    space_sharing: bool = True

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        comb = Combinations(inp, weighted=True)
        thr, sf, rem, since = inp.throughputs, inp.scale_factors, inp.steps_remaining, inp.times_since_start
        iso = isolated(thr, sf, inp.gpus)  # Gavel: from the single jobs' rates, float64
        e_iso = self.isolated_finish(inp, iso)

        def rho_of(x: np.ndarray) -> float:
            y = comb.y(x)
            with np.errstate(divide="ignore"):
                return float(np.max((since + np.where(y > 0, rem / np.where(y > 0, y, 1), np.inf)) / e_iso))

        m, n = thr.shape
        x_iso = np.tile(inp.gpus / m, (m, 1)) / sf[:, None]
        x = comb.alone(x_iso / np.maximum(x_iso.sum(axis=1), 1.0)[:, None])
        hi = rho_of(x)  # the isolated share is feasible: an upper bound
        # no job runs faster than its best rate in any combination, all the time: a lower bound
        cap = np.minimum(1.0, inp.gpus[None, :] / sf[:, None])
        best = (comb.single * cap).max(axis=1)
        for p, (ra, rb) in enumerate(comb.members):
            best[ra] = max(best[ra], float((comb.pair[p, :, 0] * cap[ra]).max()))
            best[rb] = max(best[rb], float((comb.pair[p, :, 1] * cap[rb]).max()))
        lo = float(np.max((since + rem / best) / e_iso))
        feasible = None
        if hi - lo > 1e-9 * hi:
            feasible = self._search(_PackedMaxMinValue(self, comb), rem, since, e_iso, lo, hi)
        if feasible is not None:
            x = _max_min(self, comb, feasible)
        return x


@dataclass
class MinTotalDurationPacked(GavelPolicy):
    """Minimum total duration with space sharing (Gavel's ``min_total_duration_packed``); module docstring."""

    space_sharing: bool = True

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        comb = Combinations(inp, weighted=False)
        rem = inp.steps_remaining
        x = _max_min(self, comb, rem)
        # lambda* from the interior point, as the single-job policy takes it (Gavel compares T with 1 / lambda*)
        lam = float((comb.y(x) / rem).min())
        feasible_t = gavel_horizon(1.0 / lam if lam > 0 else float("inf"))
        v = solve_ipm(self, comb.bounded(rem / feasible_t))
        return np.clip(v[:-1].reshape(comb.rows, comb.n), 0.0, 1.0)


@dataclass
class MinCostPackedSLOs(GavelPolicy):
    """Throughput per dollar with space sharing and SLOs (Gavel's
    ``max_sum_throughput_normalized_by_cost_packed_SLOs``); module docstring."""

    space_sharing: bool = True

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        comb = Combinations(inp, weighted=False)
        price = np.ones(comb.n) if inp.prices is None else inp.prices
        per_dollar = np.vstack([comb.single, comb.pair.sum(axis=2)]) / price[None, :]  # a pair: both jobs' steps
        cost = -per_dollar.ravel()
        if inp.slo_left is not None and np.isfinite(inp.slo_left).any():
            with np.errstate(divide="ignore"):
                need = np.where(np.isfinite(inp.slo_left), inp.steps_remaining / inp.slo_left, -np.inf)
            need = np.where(inp.slo_left > 0, need, -np.inf)  # a deadline already past: Gavel's row is void
            v = solve_ipm(self, comb.bounded(need, cost))
            if self._solvers["ipm"].getModelStatus() != infeasible_status():
                return np.clip(v[:-1].reshape(comb.rows, comb.n), 0.0, 1.0)
            self._count("slo_infeasible", "min cost: no allocation meets every SLO; solved without them, as Gavel does")
        v = solve_ipm(self, comb.bounded(np.full(comb.m, -np.inf), cost))
        return np.clip(v[:-1].reshape(comb.rows, comb.n), 0.0, 1.0)


@register("fifo-packed", "FIFO with space sharing: queued jobs packed onto placed jobs of equal size when the pair "
                         "runs > 1.5x their normalised rates", solves=False)
def _fifo(opts: GavelOptions) -> GavelPolicy:
    return FifoPacked(name="fifo-packed")


@register("finish-time-fairness-packed", "finish-time fairness (worst rho) with space sharing")
def _ftf(opts: GavelOptions) -> GavelPolicy:
    return FinishTimeFairnessPacked(name="finish-time-fairness-packed")


@register("min-total-duration-packed", "finish all active jobs as soon as possible, with space sharing")
def _mtd(opts: GavelOptions) -> GavelPolicy:
    return MinTotalDurationPacked(name="min-total-duration-packed")


@register("max-sum-throughput-normalized-by-cost-packed-SLOs", "minimum cost with space sharing and SLOs (without "
          "prices or SLOs: packed max-sum throughput)")
def _min_cost(opts: GavelOptions) -> GavelPolicy:
    return MinCostPackedSLOs(name="max-sum-throughput-normalized-by-cost-packed-SLOs")
