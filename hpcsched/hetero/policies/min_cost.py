"""Minimum cost: the most throughput per dollar, optionally with every job's SLO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.lp import infeasible_status, lp_program, solve_ipm
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


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
            v = solve_ipm(self, lp_program(thr, inp.scale_factors, inp.gpus, lo=need, cost=cost))
            if self._solvers["ipm"].getModelStatus() == infeasible_status():
                self._count("slo_infeasible", "min cost: no allocation meets every SLO; solved without them, "
                                              "as Gavel does")
            else:
                return np.clip(v.reshape(m, n), 0.0, 1.0)
        v = solve_ipm(self, lp_program(None, inp.scale_factors, inp.gpus, cost=cost))
        return np.clip(v.reshape(m, n), 0.0, 1.0)



@register("max-sum-throughput-normalized-by-cost-perf",
          "minimum cost: maximise throughput per dollar (prices: "
          "type=count@$/h)")
def _min_cost(opts: GavelOptions) -> GavelPolicy:
    return MinCostPerf(name="max-sum-throughput-normalized-by-cost-perf")


@register("max-sum-throughput-normalized-by-cost-perf-SLOs",
          "minimum cost, every job finishing by its SLO when "
          "possible")
def _min_cost_slos(opts: GavelOptions) -> GavelPolicy:
    return MinCostPerf(name="max-sum-throughput-normalized-by-cost-perf-SLOs", slos=True)
