"""A job log replayed on a machine of its size: each job on the lowest-numbered free nodes (first fit), the free
nodes kept as runs of node indices so neither time nor memory grows with the machine's size. The node-by-node
original it is checked against is ``tests/first_fit_oracle.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from hpcsched.milp.mapping import Run, Spans


class RangeFirstFit:
    """Node-by-node first fit's placements (``tests/first_fit_oracle.py``) with the free nodes kept as runs:
    the same nodes for every job, at a cost per run instead of per node.

    Wholly free nodes are a ``Spans`` of indices (a job's whole nodes are the lowest of them: a prefix of
    the runs); nodes with some cores in use are few (at most one per running job with a remainder) and
    keep ``FirstFit``'s per-free-count heaps. ``marks`` records each change of idle nodes as
    (time, +1 idle / -1 busy, lo, hi) for the node run [lo, hi).
    """

    def __init__(self, nodes: int, cpn: int) -> None:
        self.cpn = cpn
        self.free = Spans([(0, nodes)] if nodes > 0 else [])  # nodes with every core free
        self.whole = nodes
        self.partial: dict[int, int] = {}  # node -> free cores, for 0 < free < cpn
        self.heaps: list[list[int]] = [[] for _ in range(cpn)]  # heaps[f]: partial nodes with f free (lazy)
        self.count = [0] * cpn  # count[f]: partial nodes with f free, exact (a job skips the heaps with none)
        self.marks: list[tuple[float, int, int, int]] = []

    def _top(self, f: int) -> int | None:
        h = self.heaps[f]
        while h and self.partial.get(h[0]) != f:
            heapq.heappop(h)
        return h[0] if h else None

    def place(self, cores: int, now: float) -> tuple[list[Run], tuple[int, int] | None] | None:
        """(whole-node runs, (node, cores) of the remainder or None), or None when the job does not fit."""
        whole, rest = divmod(cores, self.cpn)
        if whole > self.whole:
            return None
        best = None
        if rest:  # the lowest node with room for the remainder once the whole nodes are taken
            count = self.count
            for f in range(rest, self.cpn):
                if count[f]:
                    n = self._top(f)
                    if n is not None and (best is None or n < best):
                        best = n
            nxt = self.free.nth(whole)
            if nxt is not None and (best is None or nxt < best):
                best = nxt
            if best is None:
                return None
        got: list[Run] = []
        k = whole
        while k > 0:
            lo, hi = self.free.lo[0], self.free.hi[0]
            b = min(hi, lo + k)
            got.append((lo, b))
            self.free.remove(lo, b)
            k -= b - lo
        self.whole -= whole
        for lo, hi in got:
            self.marks.append((now, -1, lo, hi))
        if best is None:
            return got, None
        left = self.partial.pop(best, None)
        if left is None:  # a wholly free node
            self.free.remove(best, best + 1)
            self.whole -= 1
            self.marks.append((now, -1, best, best + 1))
            left = self.cpn
        else:
            self.count[left] -= 1
        left -= rest
        if left > 0:
            self.partial[best] = left
            self.count[left] += 1
            heapq.heappush(self.heaps[left], best)
        return got, (best, rest)

    def release(self, whole: Sequence[Run], rest: tuple[int, int] | None, now: float) -> None:
        for lo, hi in whole:
            self.free.add(lo, hi)
            self.whole += hi - lo
            self.marks.append((now, 1, lo, hi))
        if rest is not None:
            node, cores = rest
            was = self.partial.pop(node, 0)
            if was:
                self.count[was] -= 1
            left = was + cores
            if left == self.cpn:
                self.free.add(node, node + 1)
                self.whole += 1
                self.marks.append((now, 1, node, node + 1))
            else:
                self.partial[node] = left
                self.count[left] += 1
                heapq.heappush(self.heaps[left], node)

