"""Themis: finish-time fairness (Mahajan et al., NSDI'20), without a solver by default.

A job's finish-time fairness is rho = (time it will have spent in the shared cluster) / (time it
would take in its fair 1/N share of the cluster). Themis aims to minimise the largest rho. The
default here is the greedy form of that min-max: at each decision the jobs are served worst rho
first, where, for a job of g GPUs among N active jobs on C GPUs,

    share   = min(1, ceil(C / N) / g)          (its isolated fraction of the cluster, as the reference)
    rho     = (now - submit + remaining) / (total solo time / share)

so a job that has waited long relative to its length and its fair share rises to the front. The
reference solves the fractional allocation with cvxpy (ECOS) and then orders by allocation per
second received; ``themis_cvxpy`` below does the same when the optional ``cvxpy`` extra is installed.
"""

from __future__ import annotations

import math

from hpcsched.allocator import Group, JobView, Snapshot
from hpcsched.policies._order import remaining_s, runs_every_job, solo


def _share(v: JobView, snapshot: Snapshot) -> float:
    return min(1.0, math.ceil(snapshot.cluster.gpus / max(len(snapshot.jobs), 1)) / v.gpus)


def finish_time_fairness(v: JobView, snapshot: Snapshot) -> float:
    """rho of one job if it ran solo from now on (higher = treated less fairly so far)."""
    rem = remaining_s(v)
    done_s = v.iterations_done * v.iteration_time if v.iteration_time else 0.0
    total = done_s + rem
    if not math.isfinite(total) or total <= 0:
        return 0.0
    return (snapshot.now - v.submit + rem) * _share(v, snapshot) / total


@runs_every_job
def themis(snapshot: Snapshot) -> list[Group]:
    # finish_time_fairness inlined, with the per-snapshot constants hoisted: same floats, but this
    # runs for every active job at every event (thousands on deep queues)
    jobs, now, inf = snapshot.jobs, snapshot.now, math.inf
    fair = math.ceil(snapshot.cluster.gpus / max(len(jobs), 1))
    shares: dict[int, float] = {}
    keys = []
    for v in jobs:
        rem = v.remaining_s if v.remaining_s is not None else inf
        total = (v.iterations_done * v.iteration_time if v.iteration_time else 0.0) + rem
        if not math.isfinite(total) or total <= 0:
            keys.append(-0.0)
            continue
        share = shares.get(v.gpus)
        if share is None:
            share = shares[v.gpus] = min(1.0, fair / v.gpus)
        keys.append(-((now - v.submit + rem) * share / total))
    return [solo(jobs[i].id) for i in sorted(range(len(jobs)), key=keys.__getitem__)]


def themis_cvxpy(snapshot: Snapshot) -> list[Group]:
    """The reference's formulation: min max rho over fractional allocations x in [0, 1] (needs cvxpy)."""
    import cvxpy as cp

    views = snapshot.jobs
    if not views:
        return []
    gpus = [v.gpus for v in views]
    x = cp.Variable(len(views))
    ratios = []
    for i, v in enumerate(views):
        rem = remaining_s(v)
        if not math.isfinite(rem):
            rem = 1e12
        isolated = rem / _share(v, snapshot)
        ratios.append((snapshot.now - v.submit + rem * cp.inv_pos(x[i])) / max(isolated, 1e-9))
    objective = cp.Minimize(ratios[0] if len(ratios) == 1 else cp.maximum(*ratios))
    constraints = [x >= 0, x <= 1, cp.sum(cp.multiply(gpus, x)) <= snapshot.cluster.gpus]
    solvers = cp.installed_solvers()
    solver = next((s for s in ("ECOS", "CLARABEL", "SCS") if s in solvers), None)  # the reference used ECOS
    try:
        cp.Problem(objective, constraints).solve(solver=solver)
    except cp.error.SolverError:
        return themis(snapshot)  # a solver failure must not stop a simulation: fall back to the greedy
    alloc = [float(a) if a is not None else 0.0 for a in (x.value if x.value is not None else [0.0] * len(views))]
    # the reference: allocation per second received, never-run jobs first
    key = [a * 1e9 if v.executed_s == 0 else a / v.executed_s for a, v in zip(alloc, views, strict=True)]
    order = sorted(range(len(views)), key=lambda i: (-key[i], -alloc[i]))
    return [Group((views[i].id,)) for i in order]
