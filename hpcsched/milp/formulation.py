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

Identical jobs are one class. Jobs with the same value table, current count and
preemption flag are interchangeable: any permutation of their counts is worth the same and moves
as many nodes. Modelled one by one, k such jobs give k! equivalent branch-and-bound subtrees, and
HiGHS ran into its 10 s limit on ~270 waiting shufflenet jobs. A class of k jobs is therefore
modelled by counts instead of choices:

    y_p integer in [0, k]            jobs of the class on piece p,     sum_{p of class} y_p = k
    m_p integer in [0, (b_p - a_p) y_p]   extra nodes of those jobs together

which is exact: any y_p jobs can share any m_p in that range, each taking at most b_p - a_p extra
nodes, and the value is linear in m_p. ``Model.counts`` turns (y, m) back into one count per job
deterministically (pieces filled one job at a time, larger counts to earlier jobs of the class,
i.e. the order constraint n_i >= n_{i+1}). A class of one is literally the per-job model above
(y_p binary), so a decision in which every job differs builds the same model as before.

Decisions of at most ``PER_JOB_UP_TO`` jobs keep one class per job. Their symmetry is cheap (at most
10! orderings; 10 identical shufflenet jobs solve in < 0.05 s either way), and the class model,
although it has the same optimum, leads HiGHS to other optima among ties: the published BFTrainer
replays (maxJ 10, bench/RESULTS.md) would follow other trajectories (utilisation 0.8735 instead of
0.8715 at Tfwd 1). Past that size classes are always used: 64 identical jobs already took 3.4 s job
by job and 100 hit a 5 s limit, against 0.02 s as classes (bench/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcsched.milp.problem import JobValue

_REL_TOL = 1e-9
PER_JOB_UP_TO = 10  # decisions with at most this many jobs are modelled job by job (see the module doc)


@dataclass(frozen=True, slots=True)
class Piece:
    job: int  # index of the job class (``Model.classes``); the job itself when every job differs
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
    z_index: list[int]  # variable index of each piece's job count y_p (a 0/1 selector for a class of one)
    m_index: list[int]  # variable index of each piece's extra count, -1 for single-point pieces
    n_jobs: int
    classes: tuple[tuple[int, ...], ...] = ()  # job indices of each class, ascending; () = one class per job

    @property
    def n_vars(self) -> int:
        return len(self.c)

    def _classes(self) -> tuple[tuple[int, ...], ...]:
        return self.classes or tuple((j,) for j in range(self.n_jobs))

    def counts(self, x: np.ndarray) -> list[int]:
        """Node counts per job from a solution vector (rounded: solvers return integers up to tolerance).

        Within a class each piece's y_p jobs are filled one at a time (b_p - a_p extra nodes each until
        m_p is spent), and the counts go in descending order to the class's jobs in problem order: one
        deterministic answer among the equivalent permutations, so a replay is reproducible."""
        per_class: list[list[int]] = [[] for _ in self._classes()]
        for p, zi, mi in zip(self.pieces, self.z_index, self.m_index, strict=True):
            k = int(round(x[zi]))
            extra = int(round(x[mi])) if mi >= 0 else 0
            for _ in range(k):
                e = min(extra, p.hi - p.lo)
                per_class[p.job].append(p.lo + e)
                extra -= e
        out = [0] * self.n_jobs
        for members, got in zip(self._classes(), per_class, strict=True):
            if len(got) != len(members):
                raise ValueError(f"solution gives {len(got)} counts to a class of {len(members)} jobs")
            for j, n in zip(members, sorted(got, reverse=True), strict=True):
                out[j] = n
        return out

    def vector(self, counts: list[int]) -> np.ndarray:
        """The solution vector of a count vector (a warm start for the solver)."""
        x = np.zeros(self.n_vars)
        for p, zi, mi in zip(self.pieces, self.z_index, self.m_index, strict=True):
            for j in self._classes()[p.job]:
                n = counts[j]
                if p.lo <= n <= p.hi:
                    x[zi] += 1.0
                    if mi >= 0:
                        x[mi] += float(n - p.lo)
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


def job_classes(values: list[JobValue]) -> tuple[tuple[int, ...], ...]:
    """Indices of interchangeable jobs, grouped, in order of each class's first job.

    Two jobs are interchangeable when every count is worth the same to both (equal value tables, which
    covers curve, Jmin/Jmax, cap, Tup/Tdw, Tfwd and objective) and they hold the same number of nodes
    and were or were not preempted alike, so that swapping their counts changes neither the objective
    nor how nodes move. Tables are compared bit for bit: no tolerance can merge two jobs that differ.
    """
    groups: dict[tuple[bytes, int, bool], list[int]] = {}
    for j, jv in enumerate(values):
        key = (jv.table.tobytes(), jv.state.count, jv.state.preempted)
        groups.setdefault(key, []).append(j)
    return tuple(tuple(g) for g in groups.values())


def build(values: list[JobValue], pool_size: int, per_job_up_to: int = PER_JOB_UP_TO) -> Model:
    """The count model of one decision, with interchangeable jobs as one class once the decision holds
    more than ``per_job_up_to`` jobs (see the module doc); 0 always uses classes."""
    classes = job_classes(values) if len(values) > per_job_up_to else tuple((j,) for j in range(len(values)))
    pieces = [p for g, members in enumerate(classes) for p in pieces_of(g, values[members[0]])]
    c: list[float] = []
    ub: list[float] = []
    z_index, m_index = [], []
    for p in pieces:
        k = len(classes[p.job])
        z_index.append(len(c))
        c.append(p.v_lo)
        ub.append(float(k))
        if p.hi > p.lo:
            m_index.append(len(c))
            c.append(p.slope)
            ub.append(float((p.hi - p.lo) * k))
        else:
            m_index.append(-1)
    rows: list[tuple[list[int], list[float], float, float]] = []
    per_class: list[list[int]] = [[] for _ in classes]
    for i, p in enumerate(pieces):
        per_class[p.job].append(i)
    for g, idxs in enumerate(per_class):  # one piece per job: k jobs of the class spread over its pieces
        jobs_in = float(len(classes[g]))
        rows.append(([z_index[i] for i in idxs], [1.0] * len(idxs), jobs_in, jobs_in))
    for i, p in enumerate(pieces):  # m_p <= (hi - lo) y_p
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
    return Model(np.array(c), np.zeros(n), np.array(ub), rows, pieces, z_index, m_index, len(values), classes)
