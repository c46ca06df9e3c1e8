"""Maximum summed throughput."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.lp import lp_program, solve_ipm
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


@dataclass
class MaxSumThroughputPerf(GavelPolicy):
    """Maximise the summed throughput (steps/s) of all jobs (Gavel's ``max_sum_throughput_perf``)."""

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        m, n = inp.throughputs.shape

        def solve() -> np.ndarray:
            v = solve_ipm(self, lp_program(None, inp.scale_factors, inp.gpus, cost=-inp.throughputs.ravel()))
            return np.clip(v.reshape(m, n), 0.0, 1.0)

        return self._memo(inp, solve)



@register("max-sum-throughput-perf", "maximise total throughput")
def _max_sum(opts: GavelOptions) -> GavelPolicy:
    return MaxSumThroughputPerf(name="max-sum-throughput-perf")
