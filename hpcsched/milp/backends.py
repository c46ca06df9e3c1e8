"""Solver backends for the count-level model: HiGHS (default, free), CBC (python-mip 1.15), Gurobi.

Each takes the same ``formulation.Model`` and a time limit and returns the best solution it has, or
None when it found none (the caller then falls back to greedy: never an empty allocation). A time
limit with an incumbent returns that incumbent with ``optimal=False``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcsched.milp.formulation import Model

GUROBI_FREE_LIMIT = 2000  # variables (and constraints) the size-limited pip licence accepts


class SolverUnavailable(RuntimeError):
    """The backend's package is missing or its licence refuses the model: the message says which."""


@dataclass(frozen=True, slots=True)
class Solution:
    x: np.ndarray
    objective: float
    optimal: bool
    seconds: float


def _constraints(model: Model, xs: list[Any], xsum: Callable[[Iterable[Any]], Any]) -> Iterator[Any]:
    """Model rows (lo <= a.x <= hi) as the ==, >= and <= expressions that python-mip and gurobipy take;
    HiGHS takes ranges directly. An infinite side adds no constraint."""
    for idx, coef, lo, hi in model.rows:
        expr = xsum(a * xs[i] for i, a in zip(idx, coef, strict=True))
        if lo == hi:
            yield expr == lo
            continue
        if lo != -np.inf:
            yield expr >= lo
        if hi != np.inf:
            yield expr <= hi


def solve_highs(model: Model, time_limit: float, start: np.ndarray | None = None) -> Solution | None:
    """HiGHS with presolve and its large-neighbourhood heuristics off: on these small, LP-tight models
    they cost several times the branch-and-bound itself; a warm start (greedy) replaces them."""
    import highspy

    from hpcsched.solvers.highs import new_highs, run

    t0 = time.perf_counter()
    h = new_highs(time_limit)
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.setOptionValue("presolve", "off")  # presolve costs ~20x the solve on these tiny models
    for opt in ("mip_heuristic_run_rins", "mip_heuristic_run_rens", "mip_heuristic_run_root_reduced_cost"):
        h.setOptionValue(opt, False)
    inf = highspy.kHighsInf
    n = model.n_vars
    h.addVars(n, model.lb, model.ub)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), -model.c)  # HiGHS minimises
    for idx, coef, lo, hi in model.rows:
        h.addRow(-inf if lo == -np.inf else lo, inf if hi == np.inf else hi, len(idx),
                 np.array(idx, dtype=np.int32), np.array(coef))
    if start is not None:
        warm = highspy.HighsSolution()
        warm.col_value = list(start)
        warm.value_valid = True
        h.setSolution(warm)
    status = run(h)
    if h.getInfo().primal_solution_status != 2:  # 2 = feasible point available
        return None
    x = np.array(h.getSolution().col_value)
    optimal = status == highspy.HighsModelStatus.kOptimal
    return Solution(x, float(model.c @ x), optimal, time.perf_counter() - t0)


def solve_cbc(model: Model, time_limit: float, start: np.ndarray | None = None) -> Solution | None:
    try:
        import mip
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SolverUnavailable(f"cbc needs python-mip 1.15 (pip install 'hpcsched[cbc]'): {e}") from None
    t0 = time.perf_counter()
    m = mip.Model(sense=mip.MAXIMIZE, solver_name=mip.CBC)
    m.verbose = 0
    m.threads = 1
    xs = [m.add_var(lb=float(lo), ub=float(ub), var_type=mip.INTEGER, obj=float(c))
          for lo, ub, c in zip(model.lb, model.ub, model.c, strict=True)]
    for c in _constraints(model, xs, mip.xsum):
        m.add_constr(c)
    status = m.optimize(max_seconds=time_limit)
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE) or m.num_solutions == 0:
        return None
    x = np.array([v.x for v in xs], dtype=float)
    return Solution(x, float(model.c @ x), status == mip.OptimizationStatus.OPTIMAL, time.perf_counter() - t0)


def solve_gurobi(model: Model, time_limit: float, start: np.ndarray | None = None) -> Solution | None:
    try:
        import gurobipy as gp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SolverUnavailable(f"gurobi needs gurobipy (pip install 'hpcsched[gurobi]'): {e}") from None
    t0 = time.perf_counter()
    try:
        env = gp.Env(params={"OutputFlag": 0})
        m = gp.Model(env=env)
        m.Params.TimeLimit = float(time_limit)
        m.Params.Threads = 1
        m.Params.MIPGap = 1e-9
        x = [m.addVar(lb=float(lo), ub=float(ub), vtype=gp.GRB.INTEGER, obj=float(c))
             for lo, ub, c in zip(model.lb, model.ub, model.c, strict=True)]
        m.ModelSense = gp.GRB.MAXIMIZE
        for c in _constraints(model, x, gp.quicksum):
            m.addConstr(c)
        m.optimize()
    except gp.GurobiError as e:
        if "size-limited" in str(e).lower() or "model too large" in str(e).lower():
            raise SolverUnavailable(
                f"Gurobi's free licence stops at {GUROBI_FREE_LIMIT} variables/constraints; this decision has "
                f"{model.n_vars} variables and {len(model.rows)} constraints ({model.n_jobs} jobs). Use a full "
                f"licence (GRB_LICENSE_FILE) or --solver highs. Gurobi said: {e}"
            ) from None
        raise SolverUnavailable(f"Gurobi failed: {e}") from None
    if m.SolCount == 0:
        return None
    xv = np.array([v.X for v in x], dtype=float)
    return Solution(xv, float(model.c @ xv), m.Status == gp.GRB.OPTIMAL, time.perf_counter() - t0)


BACKENDS: dict[str, Callable[[Model, float, np.ndarray | None], Solution | None]] = {
    "highs": solve_highs,
    "cbc": solve_cbc,
    "gurobi": solve_gurobi,
}
