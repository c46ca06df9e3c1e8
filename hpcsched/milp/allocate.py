"""``allocate(problem)``: one harvesting decision, exact by default, never empty-handed.

The runtime controller and the replayer both call this. Solvers: ``highs`` (default), ``cbc``,
``gurobi`` (exact MILP on the count-level model), ``dp`` (exact knapsack DP, no solver), ``greedy``
and ``equal`` (baselines). A MILP that
hits its time limit returns its incumbent or greedy's answer, whichever is better; one with no
incumbent returns greedy's (status ``fallback``): the reference returns an empty allocation there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hpcsched.milp.backends import BACKENDS, SolverUnavailable
from hpcsched.milp.baselines import equal_share, greedy
from hpcsched.milp.dp import solve_dp, solve_dp_unique
from hpcsched.milp.formulation import build
from hpcsched.milp.mapping import map_nodes
from hpcsched.milp.problem import JobValue, MilpJob, Objective, Problem, job_values, objective_value

SOLVERS = (*BACKENDS, "dp", "greedy", "equal")  # the MILP backends, then the solvers that need no package


@dataclass(frozen=True, slots=True)
class MilpAllocation:
    """The new allocation: count and node ids per job id, its objective, and how it was reached."""

    counts: dict[str, int]
    nodes: dict[str, tuple[str, ...]]
    objective: float  # evaluated directly from the value functions, whatever produced the counts
    solver: str
    status: str  # optimal | time_limit | fallback | heuristic | empty
    seconds: float
    n_vars: int = 0


def solve_counts(problem: Problem, solver: str = "highs", time_limit: float = 10.0) -> tuple[list[int], str, int]:
    """The node count per job (in ``problem.jobs`` order), the status, and the model's variable count.

    Counts depend only on the jobs, their current counts, who was preempted, the pool size and Tfwd,
    so callers that see the same situation again (a long replay) may cache this and only re-map nodes.
    """
    return solve_counts_sized(problem.jobs, len(problem.pool), problem.tfwd, problem.objective, solver, time_limit)


def solve_counts_sized(jobs: Sequence[MilpJob], pool_size: int, tfwd: float = 10.0,
                       objective: Objective = Objective.REFERENCE, solver: str = "highs",
                       time_limit: float = 10.0, *, unique_shortcut: bool = False) -> tuple[list[int], str, int]:
    """``solve_counts`` from the pool's size alone, without naming its nodes.

    The decision needs only counts (each ``MilpJob``'s ``count`` and ``preempted``), so a caller that
    keeps the pool as runs of node indices (the replayer on a 49,152-node machine) decides without
    listing, hashing or validating every idle node; it is the same code path as ``solve_counts``.

    ``unique_shortcut`` (a MILP backend only): first try the DP of ``dp.solve_dp_unique``; where it proves the
    optimum unique, that is the backend's answer too (status ``optimal``, 0 variables), found in a fraction of
    a MILP solve. A replay of millions of decisions asks for it; its figures are unchanged by it.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose from {', '.join(SOLVERS)}")
    if not (tfwd > 0 and math.isfinite(tfwd)):
        raise ValueError(f"Tfwd must be a finite number > 0, got {tfwd!r}")
    size = pool_size
    values = [JobValue(s, tfwd, objective, min(s.job.jmax, size)) for s in jobs]
    if not jobs:
        return [], "empty", 0
    if solver == "greedy":
        return greedy(values, size), "heuristic", 0
    if solver == "equal":
        return equal_share(values, size), "heuristic", 0
    if solver == "dp":
        # no job takes more than its cap, so capacity past the caps' sum changes nothing (the DP's picks at
        # every saturated capacity are the same floats): without this the DP's arrays grow with the pool
        return solve_dp(values, min(size, sum(v.cap for v in values))), "optimal", 0
    if unique_shortcut:
        counts = solve_dp_unique(values, size)
        if counts is not None:
            return counts, "optimal", 0
    model = build(values, size)
    g = greedy(values, size, from_current=True)  # warm start, and the answer if the solver has none
    sol = BACKENDS[solver](model, time_limit, model.vector(g))
    if sol is None:
        return g, "fallback", model.n_vars
    counts = model.counts(sol.x)
    if sol.optimal:
        return counts, "optimal", model.n_vars
    if objective_value(values, g) > objective_value(values, counts):
        counts = g
    return counts, "time_limit", model.n_vars


def allocate(problem: Problem, solver: str = "highs", time_limit: float = 10.0) -> MilpAllocation:
    """One decision: counts from ``solver``, then node ids keeping jobs on the nodes they hold."""
    t0 = time.perf_counter()
    counts, status, n_vars = solve_counts(problem, solver, time_limit)
    nodes = map_nodes(problem.jobs, problem.pool, counts)
    final = [len(nodes[s.job.id]) for s in problem.jobs]
    return MilpAllocation(
        counts={s.job.id: n for s, n in zip(problem.jobs, final, strict=True)},
        nodes=nodes,
        objective=objective_value(job_values(problem), final),
        solver=solver,
        status=status,
        seconds=time.perf_counter() - t0,
        n_vars=n_vars,
    )


__all__ = ["MilpAllocation", "SOLVERS", "SolverUnavailable", "allocate", "solve_counts", "solve_counts_sized"]
