"""``allocate(problem)``: one harvesting decision, exact by default, never empty-handed.

The runtime controller and the replayer both call this. Solvers: ``highs`` (default), ``cbc``,
``gurobi`` (exact MILP on the count-level model), ``greedy`` and ``equal`` (baselines). A MILP that
hits its time limit returns its incumbent or greedy's answer, whichever is better; one with no
incumbent returns greedy's (status ``fallback``): the reference returns an empty allocation there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpcsched.milp.backends import BACKENDS, SolverUnavailable
from hpcsched.milp.baselines import equal_share, greedy
from hpcsched.milp.formulation import build
from hpcsched.milp.mapping import map_nodes
from hpcsched.milp.problem import Problem, job_values, objective_value

SOLVERS = ("highs", "cbc", "gurobi", "greedy", "equal")


@dataclass(frozen=True, slots=True)
class Decision:
    """The new allocation: count and node ids per job id, its objective, and how it was reached."""

    counts: dict[str, int]
    nodes: dict[str, tuple[str, ...]]
    objective: float  # evaluated directly from the value functions, whatever produced the counts
    solver: str
    status: str  # optimal | time_limit | fallback | heuristic | empty
    seconds: float
    n_vars: int = 0


def allocate(problem: Problem, solver: str = "highs", time_limit: float = 10.0) -> Decision:
    t0 = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose from {', '.join(SOLVERS)}")
    values = job_values(problem)
    size = len(problem.pool)
    if not problem.jobs:
        return Decision({}, {}, 0.0, solver, "empty", time.perf_counter() - t0)
    n_vars = 0
    if solver == "greedy":
        counts, status = greedy(values, size), "heuristic"
    elif solver == "equal":
        counts, status = equal_share(values, size), "heuristic"
    else:
        model = build(values, size)
        n_vars = model.n_vars
        sol = BACKENDS[solver](model, time_limit)
        if sol is None:
            counts, status = greedy(values, size, from_current=True), "fallback"
        else:
            counts = model.counts(sol.x)
            status = "optimal" if sol.optimal else "time_limit"
            if not sol.optimal:
                g = greedy(values, size, from_current=True)
                if objective_value(values, g) > objective_value(values, counts):
                    counts = g
    nodes = map_nodes(problem.jobs, problem.pool, counts)
    final = [len(nodes[s.job.id]) for s in problem.jobs]
    return Decision(
        counts={s.job.id: n for s, n in zip(problem.jobs, final, strict=True)},
        nodes=nodes,
        objective=objective_value(values, final),
        solver=solver,
        status=status,
        seconds=time.perf_counter() - t0,
        n_vars=n_vars,
    )


__all__ = ["Decision", "SOLVERS", "SolverUnavailable", "allocate"]
