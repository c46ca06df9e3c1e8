"""Fast heuristics over the same value functions: the yardsticks for the MILP and its fallback.

- ``greedy``: start every job at 0 (or its current count when ``from_current``) and repeatedly take
  the step with the best gain per node, where a step may jump several nodes at once (to Jmin, or
  across a non-concave dip of the curve). Never worse than doing nothing only when started from the
  current counts, which is how the allocator uses it as a fallback.
- ``equal_share``: the pool split evenly over as many jobs as can get Jmin (FCFS), capped at Jmax;
  what a scheduler without scaling curves would do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hpcsched.milp.problem import JobValue


def _best_step(t: np.ndarray, n: int, free: int) -> tuple[float, int]:
    """The best gain per node from count n, jumping up to ``free`` nodes; (0, n) if nothing gains."""
    hi = min(len(t) - 1, n + free)
    if hi <= n:
        return 0.0, n
    gain = (t[n + 1:hi + 1] - t[n]) / np.arange(1, hi - n + 1)
    k = int(np.argmax(gain))
    return (float(gain[k]), n + k + 1) if gain[k] > 1e-12 else (0.0, n)


def greedy(values: Sequence[JobValue], pool_size: int, from_current: bool = False) -> list[int]:
    tables = [v.table for v in values]
    counts = [min(v.state.count, v.cap) if from_current else 0 for v in values]
    if from_current:  # a current count outside the feasible set (below Jmin after preemption) resets to 0
        counts = [n if math.isfinite(t[n]) else 0 for n, t in zip(counts, tables, strict=True)]
    free = pool_size - sum(counts)
    if free < 0:  # the pool shrank under the current allocation: start from scratch
        counts, free = [0] * len(values), pool_size
    # each job's best step stays valid while the pool only shrinks, unless its jump no longer fits
    best = [_best_step(t, n, free) for t, n in zip(tables, counts, strict=True)]
    while free > 0:
        j = max(range(len(best)), key=lambda i: best[i][0], default=-1)
        if j < 0 or best[j][0] <= 0:
            break
        target = best[j][1]
        if target - counts[j] > free:
            best[j] = _best_step(tables[j], counts[j], free)
            continue
        free -= target - counts[j]
        counts[j] = target
        best[j] = _best_step(tables[j], target, free)
    return counts


def equal_share(values: Sequence[JobValue], pool_size: int) -> list[int]:
    counts = [0] * len(values)
    chosen: list[int] = []
    need = 0
    for j, v in enumerate(values):  # FCFS: admit while everyone admitted can still get Jmin
        if v.cap >= v.state.job.jmin and need + v.state.job.jmin <= pool_size:
            chosen.append(j)
            need += v.state.job.jmin
    if not chosen:
        return counts

    def used(level: int) -> int:
        return sum(max(values[j].state.job.jmin, min(level, values[j].cap)) for j in chosen)

    lo, hi = 0, pool_size  # water-filling: the highest common level the pool can pay for
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if used(mid) <= pool_size else (lo, mid - 1)
    for j in chosen:
        counts[j] = max(values[j].state.job.jmin, min(lo, values[j].cap))
    free = pool_size - sum(counts)
    for j in chosen:  # leftovers one node each, FCFS
        if free > 0 and counts[j] < values[j].cap:
            counts[j] += 1
            free -= 1
    return counts
