"""How fast a group of interleaved jobs iterates: the period of its best stage ordering.

Every training iteration runs data loading (CPU/IO), compute (GPU) and gradient sync (network) in turn.
Up to four jobs share one set of GPUs by each being in a different stage at a time: a synchronous
pipeline of *slots*, where in slot ``i`` the job at position ``idx`` of the ordering runs its stage
``(i - idx) mod m`` and the slot lasts as long as its slowest occupant. With ``m = max(k, 3)`` slots
(a group of four gets one empty fourth stage per job), each job does every stage once per cycle and no
two jobs ever hold the same resource, so the cycle length

    T(p) = sum over slots i of  max over positions idx of  t[p[idx]][(i - idx) mod m]

is an achievable iteration period; the group runs at ``min over orderings p of T(p)`` (the formula in
ANCHORS.md). Rotating an ordering only relabels slots when ``m == k``, so for k = 3 and 4 one position
can be fixed: 2 and 6 orderings are tried instead of 6 and 24. The minimum is exact, not heuristic.

Efficiency ("interleaving efficiency", the matching's edge weight) = busy resource time / (resources x T):
1.0 means every resource is busy all the time.

``muri4_cycle`` is the Rivendile/Muri simulator's own model (``--multi_resource 4``): four slots, data
loading spanning two of them, a two-cycle recurrence stopped when it repeats, plus a special two-job
ordering. Its published numbers depend on it, so ``--compat muri`` uses it; nothing else should.

Everything here is vectorised over many groups at once because matching scores thousands of pairs per
scheduling event.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

STAGES = 3  # data, compute, network
MAX_GROUP = 4

Stages = Sequence[float]


@cache
def _orders(k: int, rotation_free: bool) -> np.ndarray:
    """Orderings to try: all of them, or those with job 0 first when rotations are equivalent."""
    if rotation_free and k > 1:
        return np.array([(0, *p) for p in itertools.permutations(range(1, k))], dtype=np.intp)
    return np.array(list(itertools.permutations(range(k))), dtype=np.intp)


@cache
def _slot_stage(k: int, m: int) -> np.ndarray:
    """stage[i, idx] = which stage the job at position idx runs in slot i."""
    return np.array([[(i - idx) % m for idx in range(k)] for i in range(m)], dtype=np.intp)


def pipeline_periods(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best period and ordering for each of G groups of k jobs; ``t`` has shape (G, k, STAGES).

    Returns (periods shape (G,), orderings shape (G, k)), an ordering listing member indices by position.
    """
    t = np.asarray(t, dtype=float)
    g, k, s = t.shape
    if k == 1:
        return t.sum(axis=(1, 2)), np.zeros((g, 1), dtype=np.intp)
    m = max(k, s)
    if m > s:  # a fourth, empty stage per job
        t = np.concatenate([t, np.zeros((g, k, m - s))], axis=2)
    orders = _orders(k, rotation_free=(m == k))  # (P, k)
    stage = _slot_stage(k, m)  # (m, k)
    # occupant[g, p, i, idx] = t[g, orders[p, idx], stage[i, idx]]
    occ = t[:, orders[:, None, :], stage[None, :, :]]  # (G, P, m, k)
    per_order = occ.max(axis=3).sum(axis=2)  # (G, P)
    best = per_order.argmin(axis=1)
    return per_order[np.arange(g), best], orders[best]


def pipeline_period(stages: Sequence[Stages]) -> tuple[float, tuple[int, ...]]:
    """Period and best ordering of one group (see the module docstring)."""
    if not 1 <= len(stages) <= MAX_GROUP:
        raise ValueError(f"a group has 1..{MAX_GROUP} jobs, got {len(stages)}")
    periods, orders = pipeline_periods(np.asarray([stages], dtype=float))
    return float(periods[0]), tuple(int(i) for i in orders[0])


def muri4_cycles(t: np.ndarray) -> np.ndarray:
    """The Muri reference's four-slot period (before its slowdown factors) for G groups of k jobs.

    Slot boundaries f[0..8] over two cycles: in slot i the job at position (i+1)%4 syncs, (i+2)%4 computes,
    and (i+3)%4 finishes a data load begun one slot earlier. The period is the first repeating cycle
    length (relative tolerance 1e-3), else the second cycle's. Two jobs may also run as (a, -, b).
    """
    t = np.asarray(t, dtype=float)
    g, k, _ = t.shape
    if k == 1:
        return t.sum(axis=2)[:, 0]
    orders = _orders(k, rotation_free=False)  # (P, k)
    p = orders.shape[0]
    tp = t[:, orders, :]  # (G, P, k, 3)
    f = np.zeros((g, p, 9))
    period = np.zeros((g, p))
    found = np.zeros((g, p), dtype=bool)
    for i in range(8):
        a, b, c = (i + 1) % 4, (i + 2) % 4, (i + 3) % 4
        nxt = f[:, :, i + 1]
        if a < k:
            nxt = np.maximum(nxt, f[:, :, i] + tp[:, :, a, 2])
        if b < k:
            nxt = np.maximum(nxt, f[:, :, i] + tp[:, :, b, 1])
        if i > 0 and c < k:
            nxt = np.maximum(nxt, f[:, :, i - 1] + tp[:, :, c, 0])
        f[:, :, i + 1] = nxt
        if i >= 4:
            cur, prev = f[:, :, i + 1] - f[:, :, i - 3], f[:, :, i] - f[:, :, i - 4]
            close = np.abs(cur - prev) <= 1e-3 * np.maximum(np.abs(cur), np.abs(prev))
            hit = close & ~found
            period[hit] = cur[hit]
            found |= close
    fallback = f[:, :, 8] - f[:, :, 4]
    period = np.where(found & (period > 0), period, fallback)
    best = period.min(axis=1)
    if k == 2:
        split = np.maximum(t[:, 0, 0], t[:, 1, 1] + t[:, 1, 2]) + np.maximum(t[:, 1, 0], t[:, 0, 1] + t[:, 0, 2])
        best = np.minimum(best, split)
    return best


def efficiency(total_busy: float | np.ndarray, period: float | np.ndarray, resources: int = STAGES) -> np.ndarray:
    """Share of resource-time kept busy: summed stage times / (resources x period)."""
    return np.asarray(total_busy, dtype=float) / (resources * np.asarray(period, dtype=float))


@dataclass(frozen=True, slots=True)
class PeriodModel:
    """Which cycle model turns stage times into a raw group period: "pipeline" (ours) or "muri4" (compat)."""

    kind: str = "pipeline"

    def __post_init__(self) -> None:
        if self.kind not in ("pipeline", "muri4"):
            raise ValueError(f"unknown period model {self.kind!r}; known: pipeline, muri4")

    @property
    def resources(self) -> int:
        """Resources the efficiency divides by: the reference counts four (data loading as two)."""
        return 4 if self.kind == "muri4" else STAGES

    def raw_periods(self, t: np.ndarray) -> np.ndarray:
        """Raw (pre-slowdown) periods of G groups of k jobs, ``t`` shaped (G, k, 3)."""
        return muri4_cycles(t) if self.kind == "muri4" else pipeline_periods(t)[0]
