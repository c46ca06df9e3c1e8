"""Themis: finish-time fairness (Mahajan et al., NSDI'20); the reference's rule in closed form or by ECOS.

A job's finish-time fairness is rho = (time it will have spent in the shared cluster) / (time it
would take in its fair 1/N share of the cluster). Themis aims to minimise the largest rho. For a job
of g GPUs among N active jobs on C GPUs its isolated share is ``min(1, ceil(C / N) / g)`` (as the
reference computes it).

Default mode: the greedy form of that min-max. At each decision the jobs are served worst rho first,

    rho = (now - submit + remaining) / (total solo time / share)

so a job that has waited long relative to its length and its fair share rises to the front.

``compat="muri"``: the reference's own rule (Rivendile/Muri ``run_sim.py``, ``themis_sim_jobs``). It
solves  min_x max_i rho_i(x)  with  rho_i = (now - submit_i + R_i / x_i) / I_i,  0 <= x_i <= 1 and
sum g_i x_i <= C,  where R_i is the remaining solo seconds and I_i the job's isolated time, which
the reference adds up in ITERATIONS per unit of share (not seconds: its "isolated throughput" is the
share alone). It then serves jobs by allocation per second already run (never-run jobs first, by
allocation). The reference hands this program to cvxpy/ECOS at every event; it has a closed form:
at the optimum every job sits exactly at the common rho t, so x_i = R_i / (t I_i - a_i), and t is the
larger of the rho of the worst job given a whole share and the root of sum_i g_i x_i(t) = C (convex
and decreasing in t: a few Newton steps). Where capacity is slack the optimum is not unique; this
gives each job the least allocation that reaches t.

That closed form is exact, but where the capacity is slack the optimum is a box and the reference
gets whatever point ECOS lands on (not the box's analytic centre), which decides the order. On the
``_pr`` traces (every job submitted at 0) that is most events (960 of 985 on trace3_pr), and ECOS's
point gives 1.77 M s average JCT on trace3_pr against the closed form's 3.77 M s (published: 1.50 M s).
``themis-ecos`` (optional: the ``ecos`` package) hands ECOS the reference's program exactly as cvxpy
builds it (``reference_program``), at 17-93x the closed form's CPU on trace3 / trace3_pr; ``themis``
keeps the closed form, which meets the trace2 speed target (docs/simulator.md has both tables). Where
ECOS fails (numerics on badly scaled programs: a quarter of trace2_pr's events) it does what the
reference's last version does: the same program to SCS, then equal shares (``solve_reference``). SCS
is slow there (52 CPU-s for one 5,714-job event on trace2_pr, 40,850 iterations), as it was for the
reference.

Both forms are one array function (``rho_keys``: sort keys over the active jobs' columns), so the
simulator can call it on arrays it keeps up to date and sort only as far as it places
(``vector_keys``: engine contract item 10), and the policy itself, called on a snapshot, sorts the
same keys fully: the same order.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from hpcsched.allocator import DeclaredPolicy, Group, JobView, PolicyHints, Snapshot
from hpcsched.compat.muri import THEMIS_LOOP
from hpcsched.model import ClusterSpec
from hpcsched.policies import register
from hpcsched.policies.ordering import remaining_s, solo
from hpcsched.primitives.speed import SOLO_FACTOR

_log = logging.getLogger(__name__)


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


def columns(views: tuple[JobView, ...]) -> dict[str, np.ndarray]:
    """A snapshot's jobs as the arrays ``rho_keys`` reads (unknown lengths: infinite remaining time)."""
    inf = math.inf
    return {
        "submit": np.array([v.submit for v in views], dtype=float),
        "gpus": np.array([v.gpus for v in views], dtype=float),
        "iterations_total": np.array([v.iterations_total or 0 for v in views], dtype=float),
        "iteration_time": np.array([v.iteration_time or 0.0 for v in views], dtype=float),
        "remaining_s": np.array([inf if v.remaining_s is None else v.remaining_s for v in views], dtype=float),
        "iterations_done": np.array([v.iterations_done for v in views], dtype=float),
        "executed_s": np.array([v.executed_s for v in views], dtype=float),
    }


def rho_keys(
    now: float, cluster: ClusterSpec, cols: dict[str, np.ndarray], compat: str | None = None
) -> list[np.ndarray]:
    """Sort keys of the jobs in ``cols``, most significant first, lowest served first (ties: arrival
    order): worst finish-time fairness first."""
    n = len(cols["gpus"])
    if n == 0:
        return [np.zeros(0)]
    share = np.minimum(1.0, math.ceil(cluster.gpus / n) / cols["gpus"])
    if compat == "muri":
        return _reference_order(now, cluster.gpus, cols, share)
    rem = cols["remaining_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        total = cols["iterations_done"] * cols["iteration_time"] + rem
        key = -((now - cols["submit"] + rem) * share / total)
    return [np.where(np.isfinite(total) & (total > 0), key, -0.0)]


def order_by(keys: list[np.ndarray]) -> np.ndarray:
    """Positions sorted by ``keys`` (most significant first), ties in position order."""
    return np.lexsort(keys[::-1])


def min_max_allocation(a: np.ndarray, r: np.ndarray, iso: np.ndarray, g: np.ndarray, capacity: float) -> np.ndarray:
    """x minimising max_i (a_i + r_i / x_i) / iso_i  s.t.  0 <= x <= 1, sum g x <= capacity (r, iso > 0).

    Every job ends at the common optimum t with the least x reaching it: t is the worst rho at a whole
    share if that fits, else the root of f(t) = sum g_i r_i / (t iso_i - a_i) = capacity (a >= 0). Newton runs
    on 1/f, which is concave and increasing (a harmonic sum of linear terms) and exactly linear when
    one job dominates: from the left its steps never overshoot and take a handful of iterations."""
    gr = g * r
    # start at the larger of two points left of the root: the worst whole-share rho, and
    # sum(g r / iso) / capacity (each term of f is at least g r / (t iso), as a >= 0)
    t = max(float(np.max((a + r) / iso)), float(np.sum(gr / iso)) / capacity)
    for _ in range(100):
        d = t * iso - a
        q = gr / d
        f = float(q.sum())
        if f <= capacity * (1.0 + 1e-12):
            break
        step = (1.0 / capacity - 1.0 / f) * f * f / float((q * iso / d).sum())
        t += step
        if step <= 1e-15 * t:
            break
    return np.minimum(r / (t * iso - a), 1.0)


def _reference_order(now: float, capacity: float, cols: dict[str, np.ndarray], share: np.ndarray) -> list[np.ndarray]:
    r = cols["remaining_s"]
    if not np.isfinite(r).all():
        r = np.nan_to_num(r, posinf=1e12)
    done = cols["iterations_done"]
    iso = (done + np.maximum(cols["iterations_total"] - done, 0.0)) / share  # the reference's units
    live = (r > 0) & (iso > 0)
    if live.all():
        x = min_max_allocation(now - cols["submit"], r, iso, cols["gpus"], capacity)
    else:
        x = np.zeros(len(r))
        if live.any():
            x[live] = min_max_allocation(now - cols["submit"][live], r[live], iso[live], cols["gpus"][live], capacity)
    return _allocation_keys(x, cols)


def _allocation_keys(x: np.ndarray, cols: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The reference's order given the allocations: per second already run, never-run jobs first."""
    ex = cols["executed_s"]
    never = ex <= 0
    per_s = x / np.where(never, 1.0, ex)  # allocation per second received; never-run jobs first
    per_s[never] = x[never] * 1e9
    return [-per_s, -x]  # both descending, ties in arrival order (as the reference's stable reverse sort)


def reference_program(
    a: np.ndarray, rem_it: np.ndarray, iso: np.ndarray, tput: np.ndarray, g: np.ndarray, capacity: float
) -> tuple[np.ndarray, Any, np.ndarray, dict[str, Any]]:
    """``min T  s.t.  (a_i + rem_it_i / (tput_i x_i)) / iso_i <= T, 0 <= x <= 1, sum g x <= capacity`` in
    ECOS's form ``min c'z  s.t.  h - G z in K``, built exactly as cvxpy 1.x builds it from the
    reference's expressions (variables ``[T, x_1..x_n, u_1..u_n]``, ``u_i >= 1 / (tput_i x_i)`` as the
    cone ``(tput_i x_i + u_i, tput_i x_i - u_i, 2)``; cvxpy folds ``/ iso`` into ``* (1 / iso)``).
    Bit for bit, because ECOS's point on a slack program moves by up to 1e-3 when one coefficient
    moves by one ulp, and that point is the reference's order."""
    from scipy import sparse

    n = len(a)
    i = np.arange(n)
    inv = 1.0 / iso
    soc = 3 * n + 1 + 3 * i
    ones = np.ones(n)
    rows = np.concatenate([i, i, n + i, 2 * n + i, np.full(n, 3 * n), soc, soc, soc + 1, soc + 1])
    cols = np.concatenate([np.zeros(n, dtype=int), 1 + n + i, 1 + i, 1 + i, 1 + i, 1 + i, 1 + n + i, 1 + i, 1 + n + i])
    vals = np.concatenate([-ones, rem_it * inv, -ones, ones, g.astype(float), -tput, -ones, -tput, ones])
    G = sparse.csc_matrix((vals, (rows, cols)), shape=(6 * n + 1, 1 + 2 * n))
    h = np.zeros(6 * n + 1)
    h[:n] = -(a * inv)
    h[2 * n : 3 * n] = 1.0
    h[3 * n] = capacity
    h[soc + 2] = 2.0
    c = np.zeros(1 + 2 * n)
    c[0] = 1.0
    return c, G, h, {"l": 3 * n + 1, "q": [3] * n, "e": 0}


def ecos_allocation(now: float, capacity: float, cols: dict[str, np.ndarray], share: np.ndarray) -> np.ndarray:
    """The reference's allocations as its solvers return them (needs the ``ecos`` package). Its numbers as
    it reads them: iteration time = trace milliseconds x 1.015 / 1000, throughput = its inverse, remaining
    in iterations. The program goes to ``solve_reference`` (ECOS, then SCS, then equal shares)."""
    it = cols["iteration_time"]
    ms = np.round(it * 1000.0)
    it_ref = np.where(ms / 1000.0 == it, ms * SOLO_FACTOR / 1000.0, it * SOLO_FACTOR)
    done = cols["iterations_done"]
    rem_it = np.maximum(cols["iterations_total"] - done, 0.0)
    iso = (done + rem_it) / share
    a = now - cols["submit"]
    live = (rem_it > 0) & (iso > 0)
    x = np.zeros(len(a))
    if not live.any():
        return x
    g = cols["gpus"][live]
    x[live], solver = solve_reference(a[live], rem_it[live], iso[live], 1.0 / it_ref[live], g, capacity, share[live])
    if solver != "ecos":
        _log.debug("t=%s: ECOS failed on %d jobs; %s answered", now, int(live.sum()), solver)
    return x


# What cvxpy (1.2 on, with SCS 3: the reference's 2022 era) passes SCS when the caller names no option:
# eps_abs = eps_rel = 1e-5 (SCS's own default is 1e-4), everything else SCS's default (max_iters 100,000,
# acceleration_lookback 10, the direct qdldl solver). cvxpy 1.1 with SCS 2 passed eps = 1e-4 instead.
SCS_SETTINGS: dict[str, Any] = {"eps_abs": 1e-5, "eps_rel": 1e-5}


def solve_reference(
    a: np.ndarray, rem_it: np.ndarray, iso: np.ndarray, tput: np.ndarray, g: np.ndarray, capacity: float,
    share: np.ndarray,
) -> tuple[np.ndarray, str]:
    """The allocations answering ``reference_program`` and which solver gave them ("ecos", "scs" or
    "equal"), in the reference's last version's order: ECOS's point where cvxpy keeps it (optimal,
    inaccurate, iteration limit); else the same program solved by SCS (cvxpy hands SCS the same
    matrices: A = G, b = h), kept where cvxpy keeps it (solved, solved inaccurate); else equal shares,
    each job's fair 1/N share of the cluster (``share``, the isolated allocation the program is built on).
    Without the ``scs`` package the closed form answers where ECOS fails (as before SCS was modelled).
    SCS's point is kept raw, like ECOS's: within its tolerance it may sit a little outside [0, 1]. (The
    stored copy of the reference here has the SCS retry commented out; the equal allocation of its last
    version was not read, so "equal shares" is our reading; none of the six traces run to the end reaches it.)"""
    import ecos

    n = len(share)
    c, G, h, dims = reference_program(a, rem_it, iso, tput, g, capacity)
    sol = ecos.solve(c, G, h, dims, verbose=False)
    if sol["info"]["exitFlag"] in (0, 10, -1):
        return np.asarray(sol["x"][1 : 1 + n]), "ecos"
    try:
        import scs
    except ImportError:
        return min_max_allocation(a, rem_it / tput, iso, g, capacity), "closed-form"
    cones = {"l": dims["l"], "q": list(dims["q"])}
    res = scs.solve({"A": G, "b": h, "c": c}, cones, verbose=False, **SCS_SETTINGS)
    if res["info"]["status_val"] in (1, 2):
        return np.asarray(res["x"][1 : 1 + n]), "scs"
    return share.astype(float).copy(), "equal"


def ecos_keys(
    now: float, cluster: ClusterSpec, cols: dict[str, np.ndarray], compat: str | None = None
) -> list[np.ndarray]:
    """``rho_keys`` with the reference's solvers: under ``compat="muri"`` the allocations are ECOS's
    answer to the reference's program (SCS's, or equal shares, where ECOS fails); otherwise exactly
    ``rho_keys`` (the greedy)."""
    n = len(cols["gpus"])
    if compat != "muri" or n == 0:
        return rho_keys(now, cluster, cols, compat)
    share = np.minimum(1.0, math.ceil(cluster.gpus / n) / cols["gpus"])
    return _allocation_keys(ecos_allocation(now, cluster.gpus, cols, share), cols)


def _solo_in_key_order(keys: Any, name: str, doc: str, **register_as: Any) -> DeclaredPolicy:
    """A Themis policy: every job alone, in the order of ``keys`` (which the engine may also call directly:
    the ``vector_keys`` hint). One body for the closed form and the solver's form, which differ only in
    their keys."""

    def policy(snapshot: Snapshot) -> list[Group]:
        jobs = snapshot.jobs
        order = order_by(keys(snapshot.now, snapshot.cluster, columns(jobs), snapshot.compat))
        return [solo(jobs[i].id) for i in order.tolist()]

    policy.__name__ = policy.__qualname__ = name.replace("-", "_")
    policy.__doc__ = doc
    hints = PolicyHints(runs_every_job=True, vector_keys=keys, compat={"muri": THEMIS_LOOP})
    return register(name, hints=hints, **register_as)(policy)


themis = _solo_in_key_order(rho_keys, "themis", "Themis: the worst finish-time fairness first (closed form).")
themis_ecos = _solo_in_key_order(
    ecos_keys, "themis-ecos",
    "Themis with the reference's solvers (``--compat muri``; needs ``ecos``, and ``scs`` where ECOS fails); "
    "the greedy otherwise.", requires=("ecos",), extra="cvxpy")


@register("themis-cvxpy", requires=("cvxpy",), extra="cvxpy")  # the reference's SRTF loop under compat
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
    except cp.error.SolverError as e:  # a solver failure must not stop a simulation: the closed form, said
        _log.warning("themis-cvxpy: %s failed at t=%.0f (%s); this decision uses the closed form",
                     solver, snapshot.now, e)
        return themis(snapshot)
    alloc = [float(a) if a is not None else 0.0 for a in (x.value if x.value is not None else [0.0] * len(views))]
    # the reference: allocation per second received, never-run jobs first
    key = [a * 1e9 if v.executed_s == 0 else a / v.executed_s for a, v in zip(alloc, views, strict=True)]
    order = sorted(range(len(views)), key=lambda i: (-key[i], -alloc[i]))
    return [Group((views[i].id,)) for i in order]
