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
