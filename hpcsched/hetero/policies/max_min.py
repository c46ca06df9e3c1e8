"""Max-min fairness: heterogeneity-aware, agnostic (LAS) and with space sharing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.lp import max_min_allocation, packed_program, proportional, solve_ipm
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


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
        return self._memo(inp, lambda: np.clip(max_min_allocation(self, coef, inp.scale_factors, inp.gpus), 0.0, 1.0),
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



@register("max-min-fairness", "LAS: max-min fairness of GPU time, heterogeneity-agnostic")
def _agnostic(opts: GavelOptions) -> GavelPolicy:
    return MaxMinFairnessPerf(name="max-min-fairness", heterogeneity_aware=False, agnostic=True)


@register("max-min-fairness-perf",
          "max-min fairness of throughput relative to an equal share (heterogeneity-aware "
          "LAS)")
def _perf(opts: GavelOptions) -> GavelPolicy:
    return MaxMinFairnessPerf(name="max-min-fairness-perf")


@register("max-min-fairness-packed", "heterogeneity-aware max-min fairness with space sharing (pairs of jobs of equal "
                                    "size co-located on a GPU type, at the pair rates of the throughput table)")
def _packed(opts: GavelOptions) -> GavelPolicy:
    return MaxMinFairnessPacked(name="max-min-fairness-packed")
