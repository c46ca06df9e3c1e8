"""The count-level MILP as plain arrays, so every backend solves literally the same model.

Each job's value over its feasible counts {0} U [Jmin, cap] is piecewise affine but neither concave
nor continuous (rescale charges jump at the current count; curves are not concave). We cut the
domain into maximal integer intervals ("pieces") on which the value is affine and pick exactly one
piece per job (a multiple-choice, "disaggregated" formulation):

    z_p in {0,1}, m_p integer in [0, (b_p - a_p) z_p]      count_j = sum_p (a_p z_p + m_p)
    sum_{p of j} z_p = 1   for each job                     sum_j count_j <= |pool|
    maximise  sum_p v(a_p) z_p + slope_p m_p

Because a piece is affine on its integer points, this is exact (no SOS2, no interpolation error),
portable (binaries and integers only; HiGHS has no SOS constraints), and tiny: ~10 pieces per job
on BFTrainer curves, independent of the pool size. Single-point pieces carry no ``m`` variable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcsched.milp.problem import JobValue

_REL_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Piece:
    job: int  # index into the problem's jobs
    lo: int  # first count of the piece
    hi: int  # last count (== lo for a single point)
    v_lo: float  # value at lo
    slope: float  # value gained per extra node inside the piece


@dataclass(frozen=True, slots=True)
class Model:
    """maximise c.x  s.t.  row_lo <= A x <= row_hi,  lb <= x <= ub,  x integer (all variables are)."""

    c: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    rows: list[tuple[list[int], list[float], float, float]]  # (indices, coefficients, lo, hi)
    pieces: list[Piece]
    z_index: list[int]  # variable index of each piece's selector
    m_index: list[int]  # variable index of each piece's extra count, -1 for single-point pieces
    n_jobs: int

    @property
    def n_vars(self) -> int:
        return len(self.c)

    def counts(self, x: np.ndarray) -> list[int]:
        """Node counts per job from a solution vector (rounded: solvers return integers up to tolerance)."""
        out = [0] * self.n_jobs
        for p, zi, mi in zip(self.pieces, self.z_index, self.m_index, strict=True):
            if x[zi] > 0.5:
                out[p.job] = p.lo + (int(round(x[mi])) if mi >= 0 else 0)
        return out


    def vector(self, counts: list[int]) -> np.ndarray:
        """The solution vector of a count vector (a warm start for the solver)."""
        x = np.zeros(self.n_vars)
        for p, zi, mi in zip(self.pieces, self.z_index, self.m_index, strict=True):
            n = counts[p.job]
            if p.lo <= n <= p.hi:
                x[zi] = 1.0
                if mi >= 0:
                    x[mi] = float(n - p.lo)
        return x


def pieces_of(j: int, jv: JobValue) -> list[Piece]:
    """Maximal integer intervals of Jmin..cap on which the job's value is affine, plus the point 0.

    Between consecutive ``breakpoints()`` the value is affine, so a piece grows while the slope of
    each next segment equals its own; where the slope changes, the shared point stays with the
    earlier piece and the next piece starts one node later (pieces never overlap).
    """
    t = jv.table
    out = [Piece(j, 0, 0, float(t[0]), 0.0)]
    pts = jv.breakpoints()
    if not pts:
        return out
    lo, prev, slope = pts[0], pts[0], None
    for p in pts[1:]:
        s = (t[p] - t[prev]) / (p - prev)
        if slope is None or _same(s, slope):
            slope = s if slope is None else slope
        else:
            out.append(Piece(j, lo, prev, float(t[lo]), slope))
            lo = prev + 1
            slope = None if lo == p else s
        prev = p
    out.append(Piece(j, lo, prev, float(t[lo]), slope or 0.0))
    return out


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _REL_TOL * max(1.0, abs(a), abs(b))


def build(values: list[JobValue], pool_size: int) -> Model:
    pieces = [p for j, jv in enumerate(values) for p in pieces_of(j, jv)]
    c: list[float] = []
    ub: list[float] = []
    z_index, m_index = [], []
    for p in pieces:
        z_index.append(len(c))
        c.append(p.v_lo)
        ub.append(1.0)
        if p.hi > p.lo:
            m_index.append(len(c))
            c.append(p.slope)
            ub.append(float(p.hi - p.lo))
        else:
            m_index.append(-1)
    rows: list[tuple[list[int], list[float], float, float]] = []
    per_job: list[list[int]] = [[] for _ in values]
    for i, p in enumerate(pieces):
        per_job[p.job].append(i)
    for idxs in per_job:  # exactly one piece per job
        rows.append(([z_index[i] for i in idxs], [1.0] * len(idxs), 1.0, 1.0))
    for i, p in enumerate(pieces):  # m_p <= (hi - lo) z_p
        if m_index[i] >= 0:
            rows.append(([m_index[i], z_index[i]], [1.0, -float(p.hi - p.lo)], -np.inf, 0.0))
    cap_idx, cap_coef = [], []
    for i, p in enumerate(pieces):  # total nodes <= pool
        if p.lo > 0:
            cap_idx.append(z_index[i])
            cap_coef.append(float(p.lo))
        if m_index[i] >= 0:
            cap_idx.append(m_index[i])
            cap_coef.append(1.0)
    rows.append((cap_idx, cap_coef, -np.inf, float(pool_size)))
    n = len(c)
    return Model(np.array(c), np.zeros(n), np.array(ub), rows, pieces, z_index, m_index, len(values))
