"""Minimum total duration (makespan): the allocation at the horizon Gavel's bisection ends on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.lp import lp_program, max_min_allocation, solve_ipm
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


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
        x = np.clip(max_min_allocation(self, thr / rem[:, None], sf, inp.gpus), 0.0, 1.0)
        # lambda* from the interior point, not a simplex: Gavel's bisection compares T with 1 / lambda*, and a
        # T within the interior point's tolerance of it flips (A4's average JCT moves by 1%)
        lam = float(((thr * x).sum(axis=1) / rem).min())
        feasible_t = gavel_horizon(1.0 / lam if lam > 0 else float("inf"))
        m, n = thr.shape
        v = solve_ipm(self, lp_program(thr, sf, inp.gpus, lo=rem / feasible_t, cost=np.zeros(m * n)))
        return np.clip(v.reshape(m, n), 0.0, 1.0)



@register("min-total-duration-perf", "finish all active jobs as soon as possible (makespan)")
def _mtd(opts: GavelOptions) -> GavelPolicy:
    return MinTotalDurationPerf(name="min-total-duration-perf")
