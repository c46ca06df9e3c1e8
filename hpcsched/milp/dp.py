"""Exact dynamic programme over the pool size: the multiple-choice knapsack the MILP also solves.

One decision is a knapsack with one "pick a count" group per job, so a DP over capacity is exact in
O(jobs x pool x Jmax) numpy steps with no solver at all. The replayer uses it for long replays
(thousands of decisions); tests check it against brute force and against HiGHS.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcsched.milp.problem import JobValue


def solve_dp(values: Sequence[JobValue], pool_size: int) -> list[int]:
    size = max(pool_size, 0)
    best = np.zeros(size + 1)  # best[p]: the best objective of the jobs so far on at most p nodes
    picks: list[np.ndarray] = []
    for jv in values:
        t = jv.table
        new = np.full(size + 1, -np.inf)
        arg = np.zeros(size + 1, dtype=np.int64)
        for n in np.flatnonzero(np.isfinite(t[: size + 1])):  # 0 and Jmin..cap, ascending
            cand = best[: size + 1 - n] + t[n]  # for p = n..size: n nodes here, p - n for earlier jobs
            better = cand > new[n:]  # strict: the smallest count wins ties
            new[n:][better] = cand[better]
            arg[n:][better] = n
        best = new
        picks.append(arg)
    counts = [0] * len(values)
    p = size
    for j in range(len(values) - 1, -1, -1):
        counts[j] = int(picks[j][p])
        p -= counts[j]
    return counts


def solve_dp_unique(values: Sequence[JobValue], pool_size: int, rel_tol: float = 1e-7,
                    abs_tol: float = 1e-3) -> list[int] | None:
    """The optimal counts when no other count vector comes within the tolerance of them, else None.

    Why: where the optimum is unique, every exact solver must return it (HiGHS stops within a relative gap
    of 1e-9 and an absolute one of 1e-6, far inside this tolerance), so a caller may skip the solver and get
    its answer bit for bit; where optima tie (identical jobs, nodes moved along one affine piece) each solver
    breaks the tie its own way, and only that solver can say which it takes (None: ask it).

    The DP is over nodes used exactly (``f[u]``: the best value of the jobs so far on exactly ``u`` nodes),
    with a flag per ``u`` saying whether a second way to reach it comes within the tolerance. The optimum
    is unique when one ``u`` holds it alone and no cell on its path was tied: any other solution either ends
    at another ``u`` (worse by the tolerance) or leaves the path at a cell where its choice was worse.
    """
    if not values:
        return []
    size = min(max(pool_size, 0), sum(v.cap for v in values))  # capacity past the caps' sum changes nothing
    f = np.full(size + 1, -np.inf)
    f[0] = 0.0
    tied = np.zeros(size + 1, dtype=bool)
    cols = np.arange(size + 1)
    picks: list[np.ndarray] = []
    for jv in values:
        t = jv.table[: size + 1]
        ns = np.flatnonzero(np.isfinite(t))  # 0 and Jmin..cap
        prev = cols[None, :] - ns[:, None]  # u - n for every choice n (rows) and every u (columns)
        cand = np.where(prev >= 0, f[np.maximum(prev, 0)] + t[ns][:, None], -np.inf)
        a = np.argmax(cand, axis=0)
        best = cand[a, cols]
        cand[a, cols] = -np.inf
        second = cand.max(axis=0)
        n = ns[a]
        reach = np.isfinite(best)
        close = second >= best - (rel_tol * np.maximum(np.abs(np.where(reach, best, 0.0)), 1.0) + abs_tol)
        tied = reach & (close | tied[np.maximum(cols - n, 0)])
        f = best
        picks.append(n)
    u = int(np.argmax(f))
    top = float(f[u])
    if tied[u] or int((f >= top - (rel_tol * max(abs(top), 1.0) + abs_tol)).sum()) != 1:
        return None
    counts = [0] * len(values)
    for j in range(len(values) - 1, -1, -1):
        counts[j] = int(picks[j][u])
        u -= counts[j]
    return counts
