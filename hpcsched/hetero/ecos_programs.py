"""Gavel's programs solved with ECOS 2.0.14 as Gavel solves them: ``simulate --compat gavel --solver ecos``.

Why: Gavel's policies have many optimal allocations (max-min fairness fixes only the worst job's share,
min total duration asks for any feasible point), and its figures follow the one interior point ECOS
stops at. The HiGHS default (``hpcsched.hetero.policies``) returns another optimum, so a few of its
figures differ from Gavel's by 1-5% (docs/hetero.md, "Gaps"). ECOS's iterates depend on the exact
program it is given (row and column order, every coefficient to the bit), so each program here is built
as the arrays ``ecos.solve(c, G, h, dims)`` receives from cvxpy 1.5.4 for Gavel's formulation (Gavel
c4fa400, ``scheduler/policies``), recorded from Gavel's own runs and matched entry for entry:

- variables: the epigraph variable of a min/max objective first (when there is one), then x column-major
  (``x[i, j]`` at ``j * m + i``: cvxpy's Fortran order), then the auxiliaries of ``inv_pos``;
- rows (``G x <= h`` except the cones): the epigraph rows, ``-x <= 0``, per type ``sum_i sf_i x_ij <= GPUs``,
  per job ``sum_j x_ij <= 1``, then any policy rows, then the second-order cones;
- the coefficients computed with Gavel's numpy expressions in Gavel's order (its proportional and isolated
  shares included), since one ulp moves ECOS's answer.

No cvxpy: the arrays are built directly (a cvxpy compile per solve would cost more than the solve). ECOS
is GPL-3 (the ``cvxpy`` extra installs it); it is imported only when ``--solver ecos`` asks for it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy

if TYPE_CHECKING:
    import numpy as np
    import scipy.sparse

ECOS_POLICIES = ("max-min-fairness", "max-min-fairness-perf", "finish-time-fairness-perf", "min-total-duration-perf",
                 "max-sum-throughput-perf", "max-min-fairness-packed")
"""The policies with an ECOS program here (FIFO needs no solver: it runs as it is with either solver)."""

ECOS_VERSION = "2.0.14"
"""The ECOS Gavel's figures were made with (../shared/reference/gavel/README.md)."""

_OPTIMAL, _OPTIMAL_INACCURATE = 0, 10  # ECOS exit flags (cvxpy: 'optimal', 'optimal_inaccurate')
_NAMES = {0: "optimal", 1: "infeasible", 2: "unbounded", 10: "optimal_inaccurate", 11: "infeasible_inaccurate",
          12: "unbounded_inaccurate", -1: "max iterations", -2: "numerical trouble", -3: "numerical trouble",
          -4: "interrupted", -7: "solver error"}


class EcosMissing(RuntimeError):
    """``--solver ecos`` without the ``ecos`` package."""


def import_ecos() -> Any:
    """The ``ecos`` module, or EcosMissing saying which extra installs it."""
    try:
        import ecos
    except ImportError:
        raise EcosMissing("--solver ecos needs the ecos package: pip install 'hpcsched[cvxpy]' (ecos is GPL-3)") \
            from None
    return ecos


def _csc(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int]) -> scipy.sparse.csc_matrix:
    """A CSC matrix with sorted indices and no explicit zeros, as cvxpy hands ECOS."""
    import numpy as np
    import scipy.sparse

    keep = vals != 0.0
    g = scipy.sparse.csc_matrix((vals[keep], (rows[keep], cols[keep])), shape=shape)
    g.sort_indices()
    g.data = np.ascontiguousarray(g.data, dtype=float)
    return g


def _base_entries(m: int, n: int, sf: np.ndarray, col0: int, row0: int) -> tuple[list, list, list, int]:
    """Gavel's base rows over x (columns ``col0 + j*m + i``) from row ``row0``: ``-x <= 0``, type rows, job rows.

    Returns (rows, cols, values) lists of arrays and the next free row.
    """
    import numpy as np

    i = np.tile(np.arange(m), n)  # x in Fortran order: i fastest
    j = np.repeat(np.arange(n), m)
    col = col0 + j * m + i
    rows = [row0 + j * m + i, row0 + m * n + j, row0 + m * n + n + i]
    vals = [np.full(m * n, -1.0), np.asarray(sf, dtype=float)[i], np.ones(m * n)]
    return rows, [col, col, col], vals, row0 + m * n + n + m


def _base_h(m: int, n: int, gpus: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.concatenate([np.zeros(m * n), np.asarray(gpus, dtype=float), np.ones(m)])


def max_min_program(coef: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> tuple[np.ndarray, Any, np.ndarray,
                                                                                   dict[str, Any]]:
    """Gavel's ``Maximize(min(sum(multiply(coef, x), axis=1)))`` under the base constraints, as cvxpy gives ECOS.

    Variables: s (= -min), then x. Rows: ``-s - coef_i . x_i <= 0`` per job, then the base rows.
    """
    import numpy as np

    m, n = coef.shape
    i = np.tile(np.arange(m), n)
    j = np.repeat(np.arange(n), m)
    rows = [np.arange(m), i]
    cols = [np.zeros(m, dtype=int), 1 + j * m + i]
    vals = [np.full(m, -1.0), -coef[i, j]]
    br, bc, bv, nrows = _base_entries(m, n, sf, 1, m)
    g = _csc(np.concatenate(rows + br), np.concatenate(cols + bc), np.concatenate(vals + bv), (nrows, 1 + m * n))
    c = np.zeros(1 + m * n)
    c[0] = 1.0
    h = np.concatenate([np.zeros(m), _base_h(m, n, gpus)])
    return c, g, h, {"l": nrows, "q": [], "e": 0}


def linear_program(cost: np.ndarray, sf: np.ndarray, gpus: np.ndarray, need: np.ndarray | None = None,
                   thr: np.ndarray | None = None) -> tuple[np.ndarray, Any, np.ndarray, dict[str, Any]]:
    """Minimise ``cost . x`` (x column-major) under the base rows and, with ``need``, Gavel's
    ``sum(multiply(thr, x), axis=1) >= need`` rows (``-thr_i . x_i <= -need_i``) after them."""
    import numpy as np

    m, n = sf.shape[0], gpus.shape[0]
    br, bc, bv, nrows = _base_entries(m, n, sf, 0, 0)
    h = _base_h(m, n, gpus)
    if need is not None and thr is not None:
        i = np.tile(np.arange(m), n)
        j = np.repeat(np.arange(n), m)
        br.append(nrows + i)
        bc.append(j * m + i)
        bv.append(-thr[i, j])
        nrows += m
        h = np.concatenate([h, -need])
    g = _csc(np.concatenate(br), np.concatenate(bc), np.concatenate(bv), (nrows, m * n))
    return np.asarray(cost, dtype=float), g, h, {"l": nrows, "q": [], "e": 0}


def ftf_program(thr: np.ndarray, sf: np.ndarray, gpus: np.ndarray, coef: np.ndarray, offset: np.ndarray,
                ) -> tuple[np.ndarray, Any, np.ndarray, dict[str, Any]]:
    """Gavel's finish-time fairness: minimise ``max_i offset_i + coef_i inv_pos(thr_i . x_i)`` (``coef_i`` =
    remaining / isolated time, ``offset_i`` = time since start / isolated time), as cvxpy gives ECOS.

    ``inv_pos(y) <= u`` is the cone ``(y + u, y - u, 2)``. With several jobs the variables are s (the max),
    x, then u per job, and the rows ``-s + coef_i u_i <= -offset_i`` come first; with one job cvxpy drops the
    max: the variables are u, then x, and the objective is ``coef u`` (the constant aside).
    """
    import numpy as np

    m, n = thr.shape
    one = m == 1
    x0 = 1 if not one else 1  # x starts at column 1 either way (s or u before it)
    u0 = 1 + m * n if not one else 0
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    r0 = 0
    h_parts: list[np.ndarray] = []
    if not one:
        rows += [np.arange(m), np.arange(m)]
        cols += [np.zeros(m, dtype=int), u0 + np.arange(m)]
        vals += [np.full(m, -1.0), np.asarray(coef, dtype=float)]
        h_parts.append(-np.asarray(offset, dtype=float))
        r0 = m
    br, bc, bv, r = _base_entries(m, n, sf, x0, r0)
    rows += br
    cols += bc
    vals += bv
    h_parts.append(_base_h(m, n, gpus))
    nl = r
    i = np.tile(np.arange(m), n)
    j = np.repeat(np.arange(n), m)
    for k, sign in ((0, -1.0), (1, 1.0)):  # cone rows (y + u, y - u, 2): G = (-thr x - u, -thr x + u, 0)
        rows += [nl + 3 * i + k, nl + 3 * np.arange(m) + k]
        cols += [x0 + j * m + i, u0 + np.arange(m)]
        vals += [-thr[i, j], np.full(m, sign)]
    nv = 1 + m * n + (m if not one else 0)
    g = _csc(np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), (nl + 3 * m, nv))
    h_parts.append(np.tile([0.0, 0.0, 2.0], m))
    c = np.zeros(nv)
    if one:
        c[0] = float(coef[0])
    else:
        c[0] = 1.0
    return c, g, np.concatenate(h_parts), {"l": nl, "q": [3] * m, "e": 0}


@dataclass
class EcosPolicy(GavelPolicy):
    """A Gavel policy whose programs ECOS solves (counted in ``solver`` as ``ecos_solves``, any exit other than
    optimal as ``ecos_<status>`` and said once on stderr)."""

    _ecos: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._ecos = import_ecos()
        version = getattr(self._ecos, "__version__", "?")
        if version != ECOS_VERSION:  # another ECOS may stop at another point: say so, the figures may move
            self._count("ecos_other_version", f"ecos {version} is not {ECOS_VERSION}, Gavel's; its allocations, "
                                              "so the figures, may differ from Gavel's")

    def _solve(self, program: tuple[np.ndarray, Any, np.ndarray, dict[str, Any]], what: str, *,
               probe: bool = False) -> tuple[np.ndarray | None, int]:
        """(x, ECOS exit flag); x is None where cvxpy would give Gavel no value (no solution, or an error).

        ``probe``: a feasibility test in a search, where 'infeasible' is an answer, not trouble (counted as
        ``ecos_probes_infeasible``, not said)."""
        c, g, h, dims = program
        sol = self._ecos.solve(c, g, h, dims, verbose=False)
        flag = int(sol["info"]["exitFlag"])
        self._count("ecos_solves")
        if probe and flag == 1:
            self._count("ecos_probes_infeasible")
        elif flag != _OPTIMAL:
            name = _NAMES.get(flag, str(flag)).replace(" ", "_")
            note = ("its point is used, as Gavel uses it" if flag == _OPTIMAL_INACCURATE
                    else "no allocation from it (Gavel's cvxpy would have none)")
            self._count(f"ecos_{name}", f"ECOS ({what}) returned {_NAMES.get(flag, flag)}; {note}")
        if flag in (_OPTIMAL, _OPTIMAL_INACCURATE):
            return sol["x"], flag
        return None, flag


def _flatten_sf(inp: AllocationInput) -> np.ndarray:
    import numpy as np

    return np.asarray(inp.scale_factors, dtype=float)


def _proportional(thr: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """Gavel's ``ProportionalPolicy.get_throughputs`` in its arithmetic: x_ij = GPUs_j / m over the largest row sum."""
    import numpy as np

    m, n = thr.shape
    x = np.array([[g / m for g in gpus.tolist()] for _ in range(m)])
    x = x / np.sum(x, axis=1).max()
    return np.sum(np.multiply(thr, x), axis=1).reshape((m, 1))


def _isolated(thr: np.ndarray, sf: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """Gavel's ``IsolatedPolicy.get_throughputs`` in its arithmetic (a 1/m share of every type, per job)."""
    import numpy as np

    m, n = thr.shape
    x = np.array([[g / m for g in gpus.tolist()] for _ in range(m)])
    x = x / np.repeat(sf.reshape(m, 1), n, axis=1)
    per_row = np.maximum(np.sum(x, axis=1), np.ones(m))
    x = x / per_row[:, None]
    return np.sum(np.multiply(thr, x), axis=1).reshape((m, 1))


def _allocation(v: np.ndarray, col0: int, m: int, n: int) -> np.ndarray:
    """x from ECOS's variables (column-major from ``col0``), clipped to [0, 1] as Gavel clips it."""
    import numpy as np

    return np.clip(np.asarray(v[col0:col0 + m * n]).reshape(n, m).T, 0.0, 1.0)


@dataclass
class EcosMaxMinFairness(EcosPolicy):
    """Gavel's ``max_min_fairness_perf`` (and, ``agnostic``, its ``max_min_fairness``: every throughput 1)."""

    agnostic: bool = False

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.ones_like(inp.throughputs) if self.agnostic else np.asarray(inp.throughputs, dtype=float)
        m, n = thr.shape
        sfa = np.repeat(_flatten_sf(inp).reshape(m, 1), n, axis=1)
        pw = np.array([1.0 / w for w in inp.priority_weights.tolist()])
        pw = np.multiply(pw.reshape((m, 1)), 1.0 / _proportional(thr, inp.gpus).reshape((m, 1)))
        coef = np.multiply(thr * pw.reshape((m, 1)), sfa)

        def solve() -> np.ndarray:
            v, _ = self._solve(max_min_program(coef, _flatten_sf(inp), inp.gpus), "max-min fairness")
            if v is None:
                raise ValueError("max-min fairness: ECOS found no allocation (Gavel's run stops here too)")
            return _allocation(v, 1, m, n)

        return self._memo(inp, solve)


@dataclass
class EcosMaxSumThroughput(EcosPolicy):
    """Gavel's ``max_sum_throughput_perf``: maximise ``sum(multiply(throughputs / costs, x))`` (costs all 1)."""

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.asarray(inp.throughputs, dtype=float)
        m, n = thr.shape
        costs = np.ones((1, n))
        cost = -(thr / costs).T.ravel()  # Maximize -> minimise the negation, x column-major

        def solve() -> np.ndarray:
            v, _ = self._solve(linear_program(cost, _flatten_sf(inp), inp.gpus), "max-sum throughput")
            if v is None:
                raise ValueError("max-sum throughput: ECOS found no allocation (Gavel's run stops here too)")
            return _allocation(v, 0, m, n)

        return self._memo(inp, solve)


@dataclass
class EcosMinTotalDuration(EcosPolicy):
    """Gavel's ``min_total_duration_perf``: its bisection on the horizon T, one ECOS feasibility program per T,
    the allocation of the last T ECOS called 'optimal' (an inaccurate answer counts as infeasible there)."""

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.asarray(inp.throughputs, dtype=float)
        m, n = thr.shape
        rem = np.asarray(inp.steps_remaining, dtype=float)
        sf, zero = _flatten_sf(inp), np.zeros(m * n)
        max_t, min_t, last_max = 1000000.0, 100.0, 1000000.0
        feasible: np.ndarray | None = None
        while feasible is None:
            if last_max > 1e30:
                raise ValueError("min-total-duration: no horizon is feasible (a job with no throughput?)")
            while 1.05 * min_t < max_t:
                t = (min_t + max_t) / 2.0
                v, flag = self._solve(linear_program(zero, sf, inp.gpus, need=rem / t, thr=thr),
                                      "min total duration, feasibility", probe=True)
                if flag == _OPTIMAL and v is not None:
                    feasible, max_t = v, t
                else:
                    min_t = t
            max_t, min_t, last_max = last_max * 10.0, last_max, last_max * 10.0
        return _allocation(feasible, 0, m, n)


@dataclass
class EcosFinishTimeFairness(EcosPolicy):
    """Gavel's ``finish_time_fairness_perf``: its ``inv_pos`` cone program as ECOS receives it, and its
    bookkeeping of each job's cumulative isolated time (the isolated allocation when ECOS gives none)."""

    _cum_iso: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _prev_rem: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _prev_iso: dict[int, float] = field(init=False, repr=False, default_factory=dict)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.asarray(inp.throughputs, dtype=float)
        m, n = thr.shape
        sf = _flatten_sf(inp)
        iso = _isolated(thr, sf, inp.gpus)
        rem = {j: float(r) for j, r in zip(inp.job_ids, inp.steps_remaining.tolist(), strict=True)}
        since = inp.times_since_start.tolist()
        coef, offset = np.empty(m), np.empty(m)
        for i, jid in enumerate(inp.job_ids):
            if jid not in self._cum_iso:
                self._cum_iso[jid] = 0
            if jid in self._prev_rem:
                self._cum_iso[jid] += (self._prev_rem[jid] - rem[jid]) / self._prev_iso[jid]
            e_iso = self._cum_iso[jid] + (rem[jid] / iso[i])
            inv = 1.0 / e_iso  # cvxpy divides by a constant by multiplying by its reciprocal
            coef[i] = (rem[jid] * inv).item()
            offset[i] = (since[i] * inv).item()
        v, _ = self._solve(ftf_program(thr, sf, inp.gpus, coef, offset), "finish-time fairness")
        self._prev_rem = copy.copy(rem)
        self._prev_iso = {jid: float(iso[i, 0]) for i, jid in enumerate(inp.job_ids)}
        if v is None:  # Gavel's fallback: the isolated allocation
            self._count("ftf_isolated_fallback")
            x = np.array([[g / m for g in inp.gpus.tolist()] for _ in range(m)])
            x = x / np.repeat(sf.reshape(m, 1), n, axis=1)
            return x / np.maximum(np.sum(x, axis=1), np.ones(m))[:, None]
        return _allocation(v, 1, m, n)


def packed_program(coef: list[tuple[int, int, float]], combo_sf: np.ndarray, members: list[tuple[int, ...]],
                   m: int, gpus: np.ndarray) -> tuple[np.ndarray, Any, np.ndarray, dict[str, Any]]:
    """Gavel's space-sharing max-min program (``MaxMinFairnessPolicyWithPacking`` before 40a22a7: one objective
    term per job) as cvxpy gives ECOS: ``coef`` holds (job, x column, value) entries, combinations (single jobs,
    then pairs, Gavel's ``JobIdPair`` order) are x's rows, ``members`` the jobs of each.

    Several jobs: variables s, then x column-major; rows ``-s - sum coef x <= 0`` per job, then ``-x <= 0``, per
    type ``sum_c sf_c x_cj <= GPUs``, per job the sum of its combinations' x ``<= 1``. One job: no s, the
    objective is ``-coef . x``.
    """
    import numpy as np

    big_m, n = len(members), gpus.shape[0]
    one = m == 1
    x0 = 0 if one else 1
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    c = np.zeros(x0 + big_m * n)
    if one:
        for _, col, v in coef:
            c[x0 + col] = -v
        r0 = 0
    else:
        c[0] = 1.0
        ci = np.array([e[0] for e in coef], dtype=int)
        rows += [np.arange(m), ci]
        cols += [np.zeros(m, dtype=int), x0 + np.array([e[1] for e in coef], dtype=int)]
        vals += [np.full(m, -1.0), -np.array([e[2] for e in coef])]
        r0 = m
    i = np.tile(np.arange(big_m), n)
    j = np.repeat(np.arange(n), big_m)
    col = x0 + j * big_m + i
    rows += [r0 + j * big_m + i, r0 + big_m * n + j]
    cols += [col, col]
    vals += [np.full(big_m * n, -1.0), np.asarray(combo_sf, dtype=float)[i]]
    jr = r0 + big_m * n + n
    for cc, mem in enumerate(members):
        for job in mem:
            rows.append(jr + np.full(n, job))
            cols.append(x0 + np.arange(n) * big_m + cc)
            vals.append(np.ones(n))
    nrows = jr + m
    g = _csc(np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), (nrows, x0 + big_m * n))
    h = np.concatenate([np.zeros(r0 + big_m * n), np.asarray(gpus, dtype=float), np.ones(m)])
    return c, g, h, {"l": nrows, "q": [], "e": 0}


@dataclass
class EcosMaxMinFairnessPacked(EcosPolicy):
    """Gavel's ``max_min_fairness_packed`` (the reference README's revert of 40a22a7: per-job objective terms).

    Returns (jobs + pairs) x types, as ``policies.MaxMinFairnessPacked``. Gavel holds the rates in float32,
    divided by the job's weight there; the term of job i is ``sum(multiply(rates * sf, x[combos of i])) /
    proportional_i``, which cvxpy turns into the coefficients ``rate * sf * (1 / proportional_i)``.
    """

    space_sharing: bool = True

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        def solve() -> np.ndarray:
            thr = np.asarray(inp.throughputs, dtype=float)
            m, n = thr.shape
            pthr = inp.pair_throughputs if inp.pair_throughputs is not None else np.zeros((0, n, 2))
            row = {jid: r for r, jid in enumerate(inp.job_ids)}
            members: list[tuple[int, ...]] = [(r,) for r in range(m)] + [(row[a], row[b]) for a, b in inp.pairs]
            sf = _flatten_sf(inp)
            combo_sf = np.array([sf[mem[0]] for mem in members])
            inv = 1.0 / _proportional(thr, inp.gpus)  # (m, 1)
            w32 = inp.priority_weights.astype(np.float32)
            coef: list[tuple[int, int, float]] = []
            big_m = len(members)
            for i in range(m):
                rate = (thr[i].astype(np.float32) / w32[i]).astype(np.float32)
                for j in range(n):
                    coef.append((i, j * big_m + i, float(np.float64(rate[j]) * sf[i] * inv[i, 0])))
            for p, (a, b) in enumerate(inp.pairs):
                c_idx = m + p
                for k, jid in enumerate((a, b)):
                    r = row[jid]
                    rate = (pthr[p, :, k].astype(np.float32) / w32[r]).astype(np.float32)
                    for j in range(n):
                        coef.append((r, j * big_m + c_idx, float(np.float64(rate[j]) * combo_sf[c_idx] * inv[r, 0])))
            v, _ = self._solve(packed_program(coef, combo_sf, members, m, inp.gpus), "max-min fairness, packed")
            if v is None:
                raise ValueError("max-min fairness (packed): ECOS found no allocation (Gavel's run stops here too)")
            return _allocation(v, 0 if m == 1 else 1, big_m, n)

        return self._memo(inp, solve)


def make_ecos_policy(name: str) -> GavelPolicy:
    """The ECOS version of Gavel's policy ``name`` (one of ECOS_POLICIES); EcosMissing without ecos."""
    if name == "max-min-fairness":
        return EcosMaxMinFairness(name=name, heterogeneity_aware=False, agnostic=True)
    if name == "max-min-fairness-perf":
        return EcosMaxMinFairness(name=name)
    if name == "max-sum-throughput-perf":
        return EcosMaxSumThroughput(name=name)
    if name == "min-total-duration-perf":
        return EcosMinTotalDuration(name=name)
    if name == "finish-time-fairness-perf":
        return EcosFinishTimeFairness(name=name)
    if name == "max-min-fairness-packed":
        return EcosMaxMinFairnessPacked(name=name)
    raise KeyError(f"no ECOS program for Gavel policy {name!r}; --solver ecos runs: {', '.join(ECOS_POLICIES)} "
                   "(and fifo and fifo-packed, which need no solver)")
