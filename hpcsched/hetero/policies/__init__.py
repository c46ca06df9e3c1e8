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
- ``fifo``: Gavel's stateful FIFO (jobs in arrival order get a whole GPU type each);
- the space-sharing variants of the others (``packed.py``), minimum cost (``min_cost.py``) and water-filling
  max-min fairness (``water_filling.py``).

One module per policy family, each registering its policies by Gavel's names in the same plug-in registry as
the simulator's policies (``registry.py``); ``make_policy`` is how a run gets a fresh one, and the LPs they
share are in ``lp.py``.

Why an interior-point solve: these programs have many optimal allocations (max-min only fixes the
worst job's share), and Gavel's mechanism follows whichever one its solver (ECOS, an interior-point
method) returns. HiGHS's interior point (no crossover) also returns a point inside the optimal face, not
a vertex; searches that need only an optimum's value (finish-time fairness's rho) use warm-started
simplex solves instead, and only the allocation the mechanism receives comes from the interior point.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.fifo import FifoPolicy
from hpcsched.hetero.policies.finish_time import FinishTimeFairnessPerf
from hpcsched.hetero.policies.lp import highs_solver, isolated, packed_program, proportional, run_lp, solve_ipm
from hpcsched.hetero.policies.max_min import MaxMinFairnessPacked, MaxMinFairnessPerf
from hpcsched.hetero.policies.max_sum import MaxSumThroughputPerf
from hpcsched.hetero.policies.min_cost import MinCostPerf
from hpcsched.hetero.policies.min_total_duration import MinTotalDurationPerf, gavel_horizon
from hpcsched.hetero.policies.registry import REGISTRY, GavelEntry, GavelOptions, register
from hpcsched.hetero.policies.water_filling import WaterFilling

POLICIES: dict[str, str] = {name: REGISTRY.get(name).summary for name in REGISTRY.names()}
"""Gavel's policies this package runs, by Gavel's names with hyphens: name -> one line (every registered one)."""

NO_SOLVER: tuple[str, ...] = tuple(name for name in POLICIES if not REGISTRY.get(name).solves)
"""Policies that solve no program: the same with either ``solver``."""


def make_policy(name: str, seed: int = 0, *, entity_weights: Mapping[str, float] | None = None,
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
    return REGISTRY.get(name).make(GavelOptions(seed, dict(entity_weights or {})))


__all__ = ["NO_SOLVER", "POLICIES", "REGISTRY", "AllocationInput", "FifoPolicy", "FinishTimeFairnessPerf",
           "GavelEntry", "GavelOptions", "GavelPolicy", "MaxMinFairnessPacked", "MaxMinFairnessPerf",
           "MaxSumThroughputPerf", "MinCostPerf", "MinTotalDurationPerf", "WaterFilling", "gavel_horizon",
           "highs_solver", "isolated", "make_policy", "packed_program", "proportional", "register", "run_lp",
           "solve_ipm"]
